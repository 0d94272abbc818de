"""The OpenAI request bodies the server accepts (pydantic), plus specfold's extension fields.

Unknown fields and fields of the wrong type are rejected (400). ``temperature`` / ``top_p`` / ``seed`` / ``user``
are accepted for client compatibility and do not change anything: decoding is the deterministic
confidence-threshold rule. ``method`` and ``delta`` choose the decoding method per request (default: the
server's ``--method`` / ``--delta``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: StrictBool = False


class _Common(_Body):
    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, gt=0)
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: StrictInt | None = None
    user: StrictStr | None = None
    # specfold extensions
    method: StrictStr | None = None
    delta: float | None = None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(_Common):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]


class TextPart(_Body):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: StrictInt | None = Field(None, gt=0)
