"""Chat templates: the GGUF's Jinja template, rendered as Hugging Face and llama.cpp do, or a
built-in one (llama.cpp's llm_chat_apply_template formats) when the GGUF has none.

    tmpl = ChatTemplate.from_gguf(gguf_file)             # or override="chatml" / a file / Jinja text
    prompt = tmpl.render(messages, add_generation_prompt=True)
    ids = tokenizer.encode(prompt, add_special=True, parse_special=True)

The rendered text leaves out a leading BOS (and trailing EOS) when the tokenizer adds it, as
llama.cpp's common_chat_templates_apply does, so encoding with add_special=True gives it once.
A template is untrusted code from the model file: it renders in template_sandbox's
LimitedSandbox, under a time budget and size limits (TemplateLimitError past them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import jinja2
import jinja2.ext
from jinja2 import nodes

from ..errors import TemplateError, TemplateLimitError, TemplateRefusedError
from . import template_sandbox
from .bpe import pre_tokenizer_adds_bos
from .template_sandbox import LimitedSandbox, RenderBudget, input_size, render_limited

if TYPE_CHECKING:
    from ..seams import MetadataSource, PromptTemplate

_C_SPACE = " \t\n\v\f\r"


# --- built-in templates: llama.cpp's llm_chat_apply_template, written in Jinja ----------------
# `ltrim` is llama.cpp's trim(): ASCII whitespace only, both ends.
_BUILTIN_SOURCES: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "llama2": (
        "{{ '[INST] ' }}{% set ns = namespace(inside=true) %}{% for m in messages %}"
        "{% if not ns.inside %}{% set ns.inside = true %}{{ '[INST] ' }}{% endif %}"
        "{% if m.role == 'system' %}{{ m.content + '\\n' }}"
        "{% elif m.role == 'user' %}{{ m.content + ' [/INST]' }}"
        "{% else %}{{ m.content + '</s>' }}{% set ns.inside = false %}{% endif %}{% endfor %}"
    ),
    "llama2-sys": (
        "{{ '[INST] ' }}{% set ns = namespace(inside=true) %}{% for m in messages %}"
        "{% if not ns.inside %}{% set ns.inside = true %}{{ '[INST] ' }}{% endif %}"
        "{% if m.role == 'system' %}{{ '<<SYS>>\\n' + m.content + '\\n<</SYS>>\\n\\n' }}"
        "{% elif m.role == 'user' %}{{ m.content + ' [/INST]' }}"
        "{% else %}{{ m.content + '</s>' }}{% set ns.inside = false %}{% endif %}{% endfor %}"
    ),
    "llama2-sys-bos": (
        "{{ '[INST] ' }}{% set ns = namespace(inside=true) %}{% for m in messages %}"
        "{% if not ns.inside %}{% set ns.inside = true %}{{ '<s>[INST] ' }}{% endif %}"
        "{% if m.role == 'system' %}{{ '<<SYS>>\\n' + m.content + '\\n<</SYS>>\\n\\n' }}"
        "{% elif m.role == 'user' %}{{ m.content + ' [/INST]' }}"
        "{% else %}{{ m.content + '</s>' }}{% set ns.inside = false %}{% endif %}{% endfor %}"
    ),
    "llama2-sys-strip": (
        "{{ '[INST] ' }}{% set ns = namespace(inside=true) %}{% for m in messages %}"
        "{% if not ns.inside %}{% set ns.inside = true %}{{ '[INST] ' }}{% endif %}"
        "{% if m.role == 'system' %}{{ '<<SYS>>\\n' + m.content | ltrim + '\\n<</SYS>>\\n\\n' }}"
        "{% elif m.role == 'user' %}{{ m.content | ltrim + ' [/INST]' }}"
        "{% else %}{{ m.content | ltrim + '</s>' }}{% set ns.inside = false %}{% endif %}{% endfor %}"
    ),
    "mistral-v1": (
        "{% set ns = namespace(inside=false) %}{% for m in messages %}"
        "{% if not ns.inside %}{{ ' [INST] ' }}{% set ns.inside = true %}{% endif %}"
        "{% if m.role == 'system' %}{{ m.content + '\\n\\n' }}"
        "{% elif m.role == 'user' %}{{ m.content + ' [/INST]' }}"
        "{% else %}{{ ' ' + m.content + '</s>' }}{% set ns.inside = false %}{% endif %}{% endfor %}"
    ),
    "mistral-v3": (
        "{% set ns = namespace(inside=false) %}{% for m in messages %}"
        "{% if not ns.inside %}{{ '[INST] ' }}{% set ns.inside = true %}{% endif %}"
        "{% if m.role == 'system' %}{{ m.content + '\\n\\n' }}"
        "{% elif m.role == 'user' %}{{ m.content + '[/INST]' }}"
        "{% else %}{{ ' ' + m.content | ltrim + '</s>' }}{% set ns.inside = false %}{% endif %}{% endfor %}"
    ),
    "mistral-v3-tekken": (
        "{% set ns = namespace(inside=false) %}{% for m in messages %}"
        "{% if not ns.inside %}{{ '[INST]' }}{% set ns.inside = true %}{% endif %}"
        "{% if m.role == 'system' %}{{ m.content + '\\n\\n' }}"
        "{% elif m.role == 'user' %}{{ m.content + '[/INST]' }}"
        "{% else %}{{ m.content + '</s>' }}{% set ns.inside = false %}{% endif %}{% endfor %}"
    ),
    "mistral-v7": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ '[SYSTEM_PROMPT] ' + m.content + '[/SYSTEM_PROMPT]' }}"
        "{% elif m.role == 'user' %}{{ '[INST] ' + m.content + '[/INST]' }}"
        "{% else %}{{ ' ' + m.content + '</s>' }}{% endif %}{% endfor %}"
    ),
    "mistral-v7-tekken": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ '[SYSTEM_PROMPT]' + m.content + '[/SYSTEM_PROMPT]' }}"
        "{% elif m.role == 'user' %}{{ '[INST]' + m.content + '[/INST]' }}"
        "{% else %}{{ m.content + '</s>' }}{% endif %}{% endfor %}"
    ),
    "phi3": (
        "{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    ),
    "phi4": (
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '<|im_sep|>' + m.content + '<|im_end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
    ),
    "falcon3": (
        "{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    ),
    "zephyr": (
        "{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content + '<|endoftext|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    ),
    "gemma": (
        "{% set ns = namespace(system='') %}{% for m in messages %}"
        "{% if m.role == 'system' %}{% set ns.system = ns.system + m.content | ltrim %}{% else %}"
        "{% set role = 'model' if m.role == 'assistant' else m.role %}"
        "{{ '<start_of_turn>' + role + '\\n' }}"
        "{% if ns.system and role != 'model' %}{{ ns.system + '\\n\\n' }}{% set ns.system = '' %}{% endif %}"
        "{{ m.content | ltrim + '<end_of_turn>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
    ),
    "vicuna": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content + '\\n\\n' }}"
        "{% elif m.role == 'user' %}{{ 'USER: ' + m.content + '\\n' }}"
        "{% elif m.role == 'assistant' %}{{ 'ASSISTANT: ' + m.content + '</s>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
    ),
    "vicuna-orca": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ 'SYSTEM: ' + m.content + '\\n' }}"
        "{% elif m.role == 'user' %}{{ 'USER: ' + m.content + '\\n' }}"
        "{% elif m.role == 'assistant' %}{{ 'ASSISTANT: ' + m.content + '</s>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
    ),
    "deepseek": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}"
        "{% elif m.role == 'user' %}{{ '### Instruction:\\n' + m.content + '\\n' }}"
        "{% elif m.role == 'assistant' %}{{ '### Response:\\n' + m.content + '\\n<|EOT|>\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '### Response:\\n' }}{% endif %}"
    ),
    "deepseek2": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content + '\\n\\n' }}"
        "{% elif m.role == 'user' %}{{ 'User: ' + m.content + '\\n\\n' }}"
        "{% elif m.role == 'assistant' %}{{ 'Assistant: ' + m.content + '<｜end▁of▁sentence｜>' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
    ),
    "deepseek3": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content + '\\n\\n' }}"
        "{% elif m.role == 'user' %}{{ '<｜User｜>' + m.content }}"
        "{% elif m.role == 'assistant' %}{{ '<｜Assistant｜>' + m.content + '<｜end▁of▁sentence｜>' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
    ),
    "command-r": (
        "{% for m in messages %}{% if m.role == 'system' %}"
        "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + m.content | ltrim + '<|END_OF_TURN_TOKEN|>' }}"
        "{% elif m.role == 'user' %}"
        "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + m.content | ltrim + '<|END_OF_TURN_TOKEN|>' }}"
        "{% elif m.role == 'assistant' %}"
        "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + m.content | ltrim + '<|END_OF_TURN_TOKEN|>' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"
    ),
    "llama3": (
        "{% for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | ltrim"
        " + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    ),
    "llama4": (
        "{% for m in messages %}{{ '<|header_start|>' + m.role + '<|header_end|>\\n\\n' + m.content | ltrim"
        " + '<|eot|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|header_start|>assistant<|header_end|>\\n\\n' }}{% endif %}"
    ),
    "chatglm4": (
        "{{ '[gMASK]<sop>' }}{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    ),
    "exaone3": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ '[|system|]' + m.content | ltrim + '[|endofturn|]\\n' }}"
        "{% elif m.role == 'user' %}{{ '[|user|]' + m.content | ltrim + '\\n' }}"
        "{% elif m.role == 'assistant' %}{{ '[|assistant|]' + m.content | ltrim + '[|endofturn|]\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '[|assistant|]' }}{% endif %}"
    ),
    "granite": (
        "{% for m in messages %}{{ '<|start_of_role|>' + m.role + '<|end_of_role|>' }}"
        "{% if m.role == 'assistant_tool_call' %}{{ '<|tool_call|>' }}{% endif %}"
        "{{ m.content + '<|end_of_text|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_of_role|>assistant<|end_of_role|>\\n' }}{% endif %}"
    ),
    "openchat": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content + '<|end_of_turn|>' }}"
        "{% else %}{{ 'GPT4 Correct ' + m.role[:1] | upper + m.role[1:] + ': ' + m.content + '<|end_of_turn|>' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'GPT4 Correct Assistant:' }}{% endif %}"
    ),
}

# text that ends an assistant turn in each format (besides the tokenizer's EOG tokens)
_STOP_STRINGS: dict[str, tuple[str, ...]] = {
    "chatml": ("<|im_end|>",),
    "phi4": ("<|im_end|>",),
    "phi3": ("<|end|>",),
    "gemma": ("<end_of_turn>",),
    "llama3": ("<|eot_id|>",),
    "llama4": ("<|eot|>",),
    "zephyr": ("<|endoftext|>",),
    "deepseek": ("<|EOT|>",),
    "command-r": ("<|END_OF_TURN_TOKEN|>",),
    "exaone3": ("[|endofturn|]",),
    "granite": ("<|end_of_text|>",),
    "openchat": ("<|end_of_turn|>",),
    "chatglm4": ("<|user|>",),
    "deepseek2": ("<｜end▁of▁sentence｜>",),
    "deepseek3": ("<｜end▁of▁sentence｜>",),
    "vicuna": ("</s>",),
    "vicuna-orca": ("</s>",),
    "falcon3": ("<|user|>",),
}
for _name in (
    "llama2",
    "llama2-sys",
    "llama2-sys-bos",
    "llama2-sys-strip",
    "mistral-v1",
    "mistral-v3",
    "mistral-v3-tekken",
    "mistral-v7",
    "mistral-v7-tekken",
):
    _STOP_STRINGS[_name] = ("</s>",)


def builtin_template_names() -> list[str]:
    """Names accepted by --chat-template / ChatTemplate.builtin()."""
    return sorted(_BUILTIN_SOURCES)


def detect_template(source: str) -> str | None:
    """The built-in format a Jinja template corresponds to (llama.cpp's llm_chat_detect_template),
    or None. Used to pick stop strings; the GGUF's own template is still what gets rendered."""
    if source in _BUILTIN_SOURCES:
        return source

    def has(s: str) -> bool:
        return s in source

    if has("<|im_start|>"):
        return "phi4" if has("<|im_sep|>") else None if has("<end_of_utterance>") else "chatml"
    if source.startswith("mistral") or has("[INST]"):
        if has("[SYSTEM_PROMPT]"):
            return "mistral-v7"
        if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
            if has(" [INST]"):
                return "mistral-v1"
            if has('"[INST]"'):
                return "mistral-v3-tekken"
            return "mistral-v3"
        if has("content.strip()"):
            return "llama2-sys-strip"
        if has("bos_token + '[INST]"):
            return "llama2-sys-bos"
        return "llama2-sys" if has("<<SYS>>") else "llama2"
    if has("<|assistant|>") and has("<|end|>"):
        return "phi3"
    if has("[gMASK]<sop>"):
        return "chatglm4"
    if has("<|assistant|>") and has("<|user|>"):
        return "falcon3" if has("</s>") else None
    if has("<|user|>") and has("<|endoftext|>"):
        return "zephyr"
    if has("<start_of_turn>"):
        return "gemma"
    if has("GPT4 Correct "):
        return "openchat"
    if has("USER: ") and has("ASSISTANT: "):
        return "vicuna-orca" if has("SYSTEM: ") else "vicuna"
    if has("### Instruction:") and has("<|EOT|>"):
        return "deepseek"
    if has("<|START_OF_TURN_TOKEN|>") and has("<|USER_TOKEN|>"):
        return "command-r"
    if has("<|start_header_id|>") and has("<|end_header_id|>"):
        return "llama3"
    if has("'Assistant: ' + message['content'] + eos_token"):
        return "deepseek2"
    if has("<｜Assistant｜>") and has("<｜User｜>") and has("<｜end▁of▁sentence｜>"):
        return "deepseek3"
    if has("[|system|]") and has("[|assistant|]") and has("[|endofturn|]"):
        return "exaone3"
    if has("<|start_of_role|>"):
        return "granite"
    if has("<|header_start|>") and has("<|header_end|>"):
        return "llama4"
    return None


def fallback_template_name(arch: str | None, tokens: list[str] | None) -> str:
    """The built-in format for a GGUF without a chat template, from its architecture and vocabulary."""
    arch = (arch or "").lower()
    vocab = set(tokens or ())
    if arch.startswith("gemma") or "<start_of_turn>" in vocab:
        return "gemma"
    if "<|start_header_id|>" in vocab:
        return "llama3"
    if "<|header_start|>" in vocab:
        return "llama4"
    if "<|im_start|>" in vocab:
        return "phi4" if "<|im_sep|>" in vocab else "chatml"
    if arch in ("phi3", "phimoe") or {"<|assistant|>", "<|end|>"} <= vocab:
        return "phi3"
    if "[SYSTEM_PROMPT]" in vocab:
        return "mistral-v7"
    if "[INST]" in vocab:
        return "mistral-v3"
    if arch == "llama" and "<s>" in vocab and "</s>" in vocab:
        return "llama2"
    if arch in ("command-r", "cohere2"):
        return "command-r"
    return "chatml"


# --- the Jinja environment (Hugging Face's apply_chat_template settings) -----------------------
class _GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} (HF's assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message):
    raise TemplateRefusedError(str(message))


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        x,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_json_default,
    )


def _json_default(x):
    """What json cannot write itself: jinja's lazy sequences (`tools | map(...)`) as lists."""
    if isinstance(x, (str, bytes, Mapping)) or not hasattr(x, "__iter__"):
        raise TypeError(f"Object of type {type(x).__name__} is not JSON serializable")
    return list(x)


def _safe(value):
    """llama.cpp's `safe` changes nothing: no Markup, which would HTML-escape what is added to
    it (functionary v3.1: `"..."|safe + tool | tojson` must stay JSON)."""
    return value


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _ltrim(s):
    return str(s).strip(_C_SPACE)


class _LenientUndefined(jinja2.ChainableUndefined):
    """A missing variable as llama.cpp's Jinja engine treats it: its attributes and items are
    missing too, and `missing + 'text'` is 'text' (templates such as firefunction-v2 concatenate
    variables no caller sets). Anything else done with it fails as in Jinja."""

    __slots__ = ()

    def _concat(self, other):
        if isinstance(other, str) and self._undefined_exception is jinja2.UndefinedError:
            return other
        return self._fail_with_undefined_error()

    __add__ = __radd__ = _concat


def _make_env() -> LimitedSandbox:
    env = LimitedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=_LenientUndefined,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.filters["ltrim"] = _ltrim
    env.filters["safe"] = _safe
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.guard_filters()
    return env


_ENV = _make_env()


def _normalize_messages(messages: list[dict]) -> list[dict]:
    """Messages as templates expect them: content as a string (text parts joined), None -> ''."""
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            raise TemplateError(
                f"a chat message must be a mapping with 'role' and 'content', got {m!r:.60}"
            )
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = "\n".join(
                str(p.get("text", ""))
                for p in content
                if isinstance(p, Mapping) and p.get("type", "text") == "text"
            )
        elif content is None:
            m["content"] = ""
        elif not isinstance(content, str):
            m["content"] = str(content)
        m.setdefault("role", "user")
        out.append(m)
    return out


class ChatTemplate:
    """A chat template ready to render.

    name: 'gguf' for the model's own template, a built-in name (e.g. 'chatml', 'gemma'), the file
    name of a template file, or 'custom' for template text. family: the built-in format it
    matches (None if unknown). stop_strings: text that ends an assistant turn in that format.
    render_budget_s: seconds one render may take (engine.tokenizer.template_sandbox has the
    other limits).
    """

    render_budget_s: float = template_sandbox.BUDGET_S

    def __init__(
        self,
        source: str,
        name: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        add_bos: bool = False,
        add_eos: bool = False,
        family: str | None = None,
    ):
        self.source = source
        self.name = name
        self.family = family if family is not None else detect_template(source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self._compiled: jinja2.Template | None = None
        self._supports_thinking: bool | None = None
        self._supports_system_role: bool | None = None
        self._supports_object_arguments: bool | None = None

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, family={self.family!r})"

    @property
    def label(self) -> str:
        """The template in an error message, with where it comes from."""
        if self.name == "gguf":
            return "chat template 'gguf' (the model file's tokenizer.chat_template)"
        return f"chat template '{self.name}'"

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return _STOP_STRINGS.get(self.family or "", ())

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def builtin(cls, name: str, **kw) -> ChatTemplate:
        if name not in _BUILTIN_SOURCES:
            known = ", ".join(builtin_template_names())
            raise TemplateError(f"unknown built-in chat template '{name}' (known: {known})")
        return cls(_BUILTIN_SOURCES[name], name, family=name, **kw)

    @classmethod
    def from_gguf(
        cls,
        gguf_file: MetadataSource | str | os.PathLike[str],
        override: str | None = None,
        *,
        any_text: bool = False,
    ) -> ChatTemplate:
        """The template for a model (its metadata: a GGUFFile or a mapping; or a GGUF path).

        `override` (a built-in name, a template file, or template text) if given, else
        `tokenizer.chat_template`, else a built-in chosen by architecture and vocabulary
        (e.g. 'gemma' for Gemma 3, which ships none). With `any_text`, an override that is
        neither a built-in name nor a file is template text even without Jinja tags (it then
        renders as itself), as llama-server --jinja takes any --chat-template.

        Raises:
            TemplateError: an override that is none of the above.
        """
        if isinstance(gguf_file, (str, os.PathLike)):
            from ..gguf_file import GGUFFile

            gguf_file = GGUFFile(gguf_file)
        get = gguf_file.get
        tokens = get("tokenizer.ggml.tokens") or []
        kw = _special_kw(get, tokens)
        if override is not None:
            return cls._from_override(override, any_text, **kw)
        source = get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls(source, "gguf", **kw)
        return cls.builtin(fallback_template_name(get("general.architecture"), tokens), **kw)

    @classmethod
    def _from_override(cls, override: str, any_text: bool = False, **kw) -> ChatTemplate:
        if override in _BUILTIN_SOURCES:
            return cls.builtin(override, **kw)
        if "{{" in override or "{%" in override:
            return cls(override, "custom", **kw)
        if os.path.isfile(override):
            try:
                with open(override, encoding="utf-8") as fh:
                    source = fh.read()
            except (OSError, UnicodeDecodeError) as e:
                raise TemplateError(f"cannot read chat template file '{override}': {e}") from None
            return cls(source, os.path.basename(override), **kw)
        if any_text:
            return cls(override, "custom", **kw)
        raise TemplateError(
            f"unknown chat template '{override}': not a built-in name "
            f"({', '.join(builtin_template_names())}), a file, or Jinja text"
        )

    # --- what the template can do (llama.cpp's template caps), found by rendering probes --------
    @property
    def supports_thinking(self) -> bool:
        """Whether the template has a thinking switch, as llama.cpp's template analysis finds
        it: `enable_thinking` changes the output, and the template renders an assistant's
        reasoning or the switch changes the generation prompt (Qwen3, DeepSeek-R1, GLM...).
        Then thinking is on unless the request or --reasoning turns it off ('auto' mode)."""
        if self._supports_thinking is None:
            probe = [{"role": "user", "content": "test"}]
            thought = "THINKING 7c2d"
            reply = [
                *probe,
                {"role": "assistant", "content": "Hello", "reasoning_content": thought},
            ]
            try:
                on = self.render(probe, add_generation_prompt=True, enable_thinking=True)
                off = self.render(probe, add_generation_prompt=True, enable_thinking=False)
                shown = thought in self.render(
                    reply, add_generation_prompt=False, enable_thinking=True
                )
                self._supports_thinking = on != off and (shown or _switch_at_the_end(on, off))
            except TemplateLimitError:
                raise  # the template is at fault whatever the messages: say so now
            except TemplateError:
                self._supports_thinking = False
        return self._supports_thinking

    @property
    def supports_system_role(self) -> bool:
        """Whether the template accepts a system message (Gemma 2's raises 'System role not
        supported'). llama.cpp also merges a system message the template renders nothing of;
        here one that renders is kept, so templates that show only roles stay as written."""
        if self._supports_system_role is None:
            probe = [
                {"role": "system", "content": "System message"},
                {"role": "user", "content": "User message"},
            ]
            variables = {
                "messages": probe,
                "add_generation_prompt": True,
                "bos_token": "",
                "eos_token": "",
                "enable_thinking": False,
            }
            try:
                self._render(self._template(), variables)
                self._supports_system_role = True
            except TemplateLimitError:
                raise
            except TemplateError:
                self._supports_system_role = False
        return self._supports_system_role

    @property
    def supports_object_arguments(self) -> bool:
        """Whether the template reads tool-call arguments as an object (Llama 3.1's `tojson`,
        GLM's `.items()`): then JSON-string arguments are parsed before rendering."""
        if self._supports_object_arguments is None:
            marker = "value 5e1c"
            call = {
                "id": "call00001",
                "type": "function",
                "function": {"name": "tool1", "arguments": {"arg": marker}},
            }
            probe = [
                {"role": "user", "content": "User message"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
                {"role": "assistant", "content": "The tool response was 'tool response'"},
                {"role": "user", "content": "User message"},
            ]
            tool = {
                "type": "function",
                "function": {
                    "name": "tool1",
                    "description": "Tool description",
                    "parameters": {
                        "type": "object",
                        "properties": {"arg": {"type": "string"}},
                        "required": ["arg"],
                    },
                },
            }
            variables = {
                "messages": probe,
                "tools": [tool],
                "add_generation_prompt": True,
                "bos_token": "",
                "eos_token": "",
                "enable_thinking": False,
            }
            try:
                out = self._render(self._template(), variables)
                # printed whole, an object shows as Python's repr: that template wants the text
                self._supports_object_arguments = marker in out and f"'arg': '{marker}'" not in out
            except TemplateLimitError:
                raise
            except TemplateError:
                self._supports_object_arguments = False
        return self._supports_object_arguments

    def _prepare_messages(self, messages: list[dict]) -> list[dict]:
        """llama.cpp's workarounds before rendering: 'developer' is 'system' (except for
        gpt-oss's channel format, which has its own and reads reasoning_content as
        `thinking`), a system message the template cannot show is merged into the next
        message, and tool-call arguments sent as JSON text are parsed for templates that
        format them as objects."""
        out = _normalize_messages(messages)
        calls = [c for m in out for c in m.get("tool_calls") or () if isinstance(c, Mapping)]
        if (
            any(isinstance((c.get("function") or {}).get("arguments"), str) for c in calls)
            and self.supports_object_arguments
        ):
            for m in out:
                if m.get("tool_calls"):
                    m["tool_calls"] = [_parsed_arguments(c) for c in m["tool_calls"]]
        if "<|channel|>" not in self.source:
            for m in out:
                if m.get("role") == "developer":
                    m["role"] = "system"
        else:  # gpt-oss's template reads an assistant's reasoning as `thinking`
            for m in out:
                if isinstance(m.get("reasoning_content"), str):
                    m["thinking"] = m["reasoning_content"]
                    if m.get("tool_calls"):
                        m.pop("content", None)
        if out and out[0].get("role") == "system" and not self.supports_system_role:
            first = out.pop(0)
            if out:
                out[0]["content"] = f"{first['content']}\n{out[0]['content']}"
        return out

    # --- rendering ----------------------------------------------------------------------------
    def _template(self) -> jinja2.Template:
        if self._compiled is None:
            if len(self.source) > template_sandbox.MAX_SOURCE_CHARS:
                raise TemplateLimitError(
                    f"{self.label} is {len(self.source):,} characters long, over its "
                    f"limit of {template_sandbox.MAX_SOURCE_CHARS:,}"
                )
            try:
                self._compiled = _ENV.from_string(self.source)
            except jinja2.TemplateSyntaxError as e:
                raise TemplateError(
                    f"chat template '{self.name}' is not valid Jinja (line {e.lineno}): {e.message}"
                ) from None
            except Exception as e:  # noqa: BLE001 - any parser failure is the template's fault
                raise TemplateError(f"chat template '{self.name}' cannot be parsed: {e}") from None
        return self._compiled

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list | None = None,
        **extra,
    ) -> str:
        """The prompt text for `messages` ([{'role': ..., 'content': ...}, ...]).

        Raises:
            TemplateLimitError: the template went over a limit of the sandbox (time, sizes,
                recursion): it is at fault, whatever the messages.
            TemplateRefusedError: the template rejected the messages (raise_exception).
            TemplateError: the template is invalid, raised an exception, or failed to render.
        """
        template = self._template()
        variables = dict(extra)
        variables.update(
            messages=self._prepare_messages(messages),
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        if (
            add_generation_prompt
        ):  # llama.cpp leaves it undefined otherwise (rwkv-world tests `is defined`)
            variables["add_generation_prompt"] = True
        if tools:  # llama.cpp leaves `tools` undefined when there are none ([] included)
            variables["tools"] = tools
        now = datetime.now()  # local time, as llama.cpp's date variables and strftime_now
        variables.setdefault("date_string", now.strftime("%d %b %Y"))  # Llama 3.x
        variables.setdefault("datetime", now.strftime("%b %d %Y"))  # firefunction-v2
        if "enable_thinking" not in variables:
            variables["enable_thinking"] = self.supports_thinking
        _reasoning_variables(variables)
        text = self._render(template, variables)
        if not add_generation_prompt and "<|channel|>" in self.source:
            # gpt-oss ends a finished final answer with <|return|>; a prompt that goes on from
            # it needs <|end|> (llama.cpp common_chat_params_init_gpt_oss, issue 15417)
            i = text.rfind("<|return|>")
            if i >= 0:
                text = text[:i] + "<|end|>" + text[i + len("<|return|>") :]
        return text

    def _render(self, template: jinja2.Template, variables: dict) -> str:
        try:
            budget = RenderBudget.for_input(
                input_size(variables["messages"], variables), self.render_budget_s
            )
            text = render_limited(template, variables, budget)
        except TemplateLimitError as e:
            raise TemplateLimitError(f"{self.label} {e}") from None
        except TemplateRefusedError as e:
            raise TemplateRefusedError(
                f"chat template '{self.name}' refused the conversation: {e}"
            ) from None
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template '{self.name}' failed to render: {e}") from None
        except Exception as e:  # noqa: BLE001 - template code can raise anything
            raise TemplateError(
                f"chat template '{self.name}' failed to render: {type(e).__name__}: {e}"
            ) from None
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text


def _reasoning_variables(variables: dict[str, Any]) -> None:
    """llama-server's reasoning switches and the names templates read them by: reasoning is
    preserved in earlier turns unless `preserve_reasoning` is false (GLM's clear_thinking,
    ...), and a `reasoning_effort` is also a `reasoning_strength`. Explicit values win."""
    preserve = variables.setdefault("preserve_reasoning", True)
    if isinstance(preserve, bool):
        variables.setdefault("preserve_thinking", preserve)
        for name in ("clear_thinking", "truncate_history_thinking", "drop_thinking"):
            variables.setdefault(name, not preserve)
    effort = variables.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        variables.setdefault("reasoning_strength", effort)


def _switch_at_the_end(on: str, off: str) -> bool:
    """Whether enable_thinking changes the generation prompt, as llama.cpp's template analysis
    decides it: one output ends in text the other lacks (an opened or closed thought), not just
    a different word in the middle (Apertus' "Deliberation: enabled")."""
    if on == off:
        return False
    n = len(os.path.commonprefix([on, off]))
    if not on[n:].strip() or not off[n:].strip():
        return True
    for base, extended in ((on, off), (off, on)):  # e.g. SmolLM3: system text and tail both change
        anchor = base[-32:]  # the generation prompt, about
        pos = extended.rfind(anchor)
        if pos >= 0 and extended[pos + len(anchor) :].strip():
            return True
    return False


def _parsed_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError as e:
        raise TemplateError(f"tool call arguments are not valid JSON: {e}") from None
    return {**call, "function": {**function, "arguments": arguments}}


class PromptEncoder(Protocol):
    def encode(
        self, text: str, add_special: bool = True, parse_special: bool = False
    ) -> list[int]: ...


def encode_chat_prompt(tokenizer: PromptEncoder, text: str) -> list[int]:
    """Rendered chat text -> prompt tokens, as llama.cpp tokenizes a chat prompt (special
    tokens added where the model adds them, special-token text parsed)."""
    return tokenizer.encode(text, add_special=True, parse_special=True)


def chat_prompt_tokens(
    template: PromptTemplate, tokenizer: PromptEncoder, messages: list[dict], **extra: Any
) -> list[int]:
    """The prompt for the assistant's next turn: every front end (server, CLI, desktop app)
    builds its chat prompt here, so the same conversation gives the same tokens."""
    return encode_chat_prompt(
        tokenizer, template.render(messages, add_generation_prompt=True, **extra)
    )


def _special_kw(get, tokens: list[str]) -> dict:
    def text(key: str) -> str:
        i = get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

    model = get("tokenizer.ggml.model")
    add_bos_default = model == "llama" or (
        model == "gpt2" and pre_tokenizer_adds_bos(get("tokenizer.ggml.pre"))
    )
    add_bos = get("tokenizer.ggml.add_bos_token")
    add_eos = get("tokenizer.ggml.add_eos_token")
    return dict(
        bos_token=text("tokenizer.ggml.bos_token_id"),
        eos_token=text("tokenizer.ggml.eos_token_id"),
        add_bos=bool(add_bos_default if add_bos is None else add_bos),
        add_eos=bool(add_eos),
    )
