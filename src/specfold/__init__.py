"""specfold: faster lossless decoding for masked diffusion LLMs.

    import specfold
    model = specfold.load_model()                # the embedded model, or a path / hub id
    result = specfold.generate(model, "What is 3 + 4?", max_new_tokens=64)
    print(result.text, result.nfe, result.tokens_per_second)
"""

from specfold.api import GenerationResult, generate, load_model

__all__ = ["GenerationResult", "generate", "load_model"]
__version__ = "0.2.0"
