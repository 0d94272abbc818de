"""lm-evaluation-harness (0.4.x) adapter: the model ``specfold`` for generation tasks.

Importing this module registers the model with lm-eval (``@register_model("specfold")``); importing ``specfold``
itself never imports lm-eval. lm-eval's own CLI does not import third-party models, so run it through this module:

    python -m specfold.eval.lm_eval_model --model specfold \\
        --model_args pretrained=DIR,method=specfold,delta=0.1,budget=7,dtype=fp32,max_new_tokens=256 \\
        --tasks gsm8k --limit 50

or from Python: ``lm_eval.simple_evaluate(model=SpecFoldLM(pretrained=DIR), tasks=["gsm8k"])``.

Model args: ``pretrained`` (checkpoint dir / hub id; default the embedded model), ``method`` (vanilla, spiffy,
specfold; default specfold) and its options as :class:`~specfold.config.MethodConfig` names them (``delta``,
``budget``, ``depth``, ``graph``, ``lookahead``, ``backend``, ``ffn``, ``attention``), ``dtype``, ``device``,
``max_new_tokens`` (default generation budget; a task's ``max_gen_toks`` overrides it), ``threshold``,
``block_size``, ``small_block_size``, ``chat`` (wrap each context as one user turn through the tokenizer's chat
template, default true; skipped when lm-eval already applied the template with ``--apply_chat_template``).

Masked diffusion LLMs decode block by block and have no left-to-right likelihood, so ``loglikelihood`` and
``loglikelihood_rolling`` raise ``NotImplementedError``: only ``generate_until`` tasks are supported.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as exc:  # pragma: no cover - exercised only without lm-eval
    raise ImportError(
        "specfold.eval.lm_eval_model needs lm-evaluation-harness 0.4.x: pip install 'lm-eval>=0.4,<0.5'"
    ) from exc

from specfold.api import decode_config_for, encode_prompt, load_model, prepare_method
from specfold.config import METHOD_OPTIONS, MethodConfig
from specfold.decoding.decoder import decode

LOGLIKELIHOOD_MESSAGE = (
    "specfold decodes masked diffusion LLMs block by block and has no left-to-right log-likelihood; "
    "only generation tasks (generate_until, e.g. gsm8k, humaneval, mbpp, ifeval) are supported"
)


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "y")
    return bool(value)


def _optional(value: Any) -> Any:
    """lm-eval passes model args as parsed strings; ``none``/empty mean unset."""
    return None if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")) else value


def _method_config(method: str, options: dict[str, Any]) -> MethodConfig:
    """The MethodConfig of lm-eval's model args (strings): ``delta`` a float, ``budget``/``depth`` integers,
    ``lookahead`` and ``compile`` flags, the rest as given; ``none`` or empty = not given (an option given for a
    method it does not apply to is refused). Other args are ignored (lm-eval's own, e.g. ``batch_size``: decoding is
    one sample at a time)."""
    parse = {"delta": float, "budget": int, "depth": int, "lookahead": _flag, "compile": _flag}
    given = {k: _optional(options.get(k)) for k in METHOD_OPTIONS}
    return MethodConfig(_optional(method), **{k: parse.get(k, str)(v) for k, v in given.items() if v is not None})


def pick_device(device: str | None) -> str:
    """The requested device; lm-eval's CLI passes ``cuda`` by default, which means CPU on a machine without one."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        logging.getLogger(__name__).warning("device %s requested but CUDA is not available; using cpu", device)
        return "cpu"
    return device


def truncate_at_stops(text: str, until: list[str] | str | None) -> str:
    """The text before the earliest occurrence of any stop string (empty strings ignored)."""
    stops = [until] if isinstance(until, str) else list(until or [])
    cut = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if i != -1:
                cut = min(cut, i)
    return text[:cut]


@register_model("specfold")
class SpecFoldLM(LM):
    """lm-eval model running vanilla, spiffy or specfold decoding of a masked diffusion LLM (greedy rule)."""

    def __init__(
        self,
        pretrained: str | None = None,
        method: str = "specfold",
        dtype: str = "fp32",
        device: str | None = None,
        max_new_tokens: int = 256,
        threshold: float = 0.9,
        block_size: int | None = None,
        small_block_size: int | str | None = "auto",
        chat: bool | str = True,
        **options: Any,  # the method's options (MethodConfig fields), and lm-eval's batch_size, max_batch_size, …
    ) -> None:
        super().__init__()
        self.method_config = _method_config(method, options)  # checked before the model loads
        self.model = load_model(_optional(pretrained), dtype=dtype, device=pick_device(_optional(device)))
        if self.model.tokenizer is None:
            raise ValueError(f"{self.model.path} has no tokenizer; lm-eval tasks need one")
        sbs = _optional(small_block_size)
        self.cfg = decode_config_for(
            self.model, int(max_new_tokens), float(threshold), _optional(block_size),
            "auto" if sbs == "auto" else (int(sbs) if sbs is not None else None),
        )
        self.method_name = self.method_config.method.value
        self.method = prepare_method(self.model, self.method_config, self.cfg)
        self.chat = _flag(chat)
        self._templated_by_lm_eval = False
        # Totals over every generate_until call, for reports beside lm-eval's scores.
        self.stats: dict[str, float] = {"samples": 0, "generated_tokens": 0, "seconds": 0.0, "nfe": 0}
        self._device = self.model.net.device

    # ------------------------------------------------------------------------------------------------- chat

    @property
    def tokenizer_name(self) -> str:
        return str(self.model.path).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.model.tokenizer, "chat_template", None) or ""

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """lm-eval's ``--apply_chat_template``: render with the model's template (and don't wrap contexts again)."""
        self._templated_by_lm_eval = True
        return self.model.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # ------------------------------------------------------------------------------------------- generation

    def _encode(self, context: str, max_gen: int) -> list[int]:
        ids = encode_prompt(self.model, context, chat=self.chat and not self._templated_by_lm_eval)
        room = self.model.config.max_position_embeddings - max_gen - self.cfg.block_size
        if room <= 0:
            raise ValueError(f"max_gen_toks {max_gen} leaves no room for a prompt within the position limit")
        return ids[-room:]  # left-truncate an over-long context, as lm-eval's HF model does

    def generate_one(self, context: str, gen_kwargs: dict[str, Any] | None = None) -> str:
        """Decode one context; stop strings (``until``) cut the decoded text; ``max_gen_toks`` caps the tokens."""
        from dataclasses import replace

        gen_kwargs = dict(gen_kwargs or {})
        max_gen = int(gen_kwargs.get("max_gen_toks", self.cfg.max_new_tokens))
        cfg = replace(self.cfg, max_new_tokens=max_gen)
        ids = self._encode(context, max_gen)
        result = decode(self.model, ids, cfg, verifier=self.method.verifier, drafter=self.method.drafter)
        text = self.model.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        self.stats["samples"] += 1
        self.stats["generated_tokens"] += result.generated_tokens
        self.stats["seconds"] += result.seconds
        self.stats["nfe"] += result.nfe
        return truncate_at_stops(text, gen_kwargs.get("until"))

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            text = self.generate_one(context, gen_kwargs)
            out.append(text)
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out

    # ------------------------------------------------------------------------------------------ likelihoods

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        raise NotImplementedError(LOGLIKELIHOOD_MESSAGE)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError(LOGLIKELIHOOD_MESSAGE)


def main() -> None:
    """lm-eval's command line with the ``specfold`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
