"""Chat templates: the GGUF's Jinja template as llama.cpp renders it, built-ins, overrides, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import TemplateError
from engine.gguf_file import GGUFFile
from engine.tokenizer.chat_template import (
    ChatTemplate,
    builtin_template_names,
    detect_template,
    fallback_template_name,
)

CHATML_GGUF = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONVO = [
    {"role": "system", "content": " Be brief. "},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


def meta(**kw):
    base = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    base.update(kw)
    return base


@pytest.mark.model
def test_smollm2_template_matches_llama_cpp(smollm2_path, reference_dir):
    path = reference_dir / "tmpl-smollm2.json"
    tmpl = ChatTemplate.from_gguf(GGUFFile(smollm2_path))
    assert (tmpl.name, tmpl.family, tmpl.stop_strings) == ("gguf", "chatml", ("<|im_end|>",))
    for row in json.loads(path.read_text(encoding="utf-8"))["results"]:
        assert tmpl.render(row["messages"], add_generation_prompt=True) == row["prompt"]


@pytest.mark.model
def test_gemma3_without_template_uses_the_gemma_format(gemma3_path):
    tmpl = ChatTemplate.from_gguf(GGUFFile(gemma3_path))
    assert (tmpl.name, tmpl.family) == ("gemma", "gemma")
    assert tmpl.render(CONVO) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    assert tmpl.stop_strings == ("<end_of_turn>",)


def test_gguf_template_is_rendered_with_hf_variables():
    tmpl = ChatTemplate.from_gguf(meta(**{"tokenizer.chat_template": CHATML_GGUF}))
    assert (
        tmpl.render([{"role": "user", "content": "x"}], add_generation_prompt=False)
        == "<|im_start|>user\nx<|im_end|>\n"
    )
    src = (
        "{{ bos_token }}{{ messages | length }}{{ tools | tojson }}{{ extra_var }}"
        "{{ strftime_now('%Y') | length }}{% generation %}G{% endgeneration %}"
        "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.content }}{% endfor %}"
    )
    tmpl = ChatTemplate.from_gguf(meta(**{"tokenizer.chat_template": src}))
    out = tmpl.render(
        [{"role": "user", "content": "a"}, {"role": "user", "content": "é"}],
        tools=[{"name": "f"}],
        extra_var="!",
    )
    assert out == '<|im_start|>2[{"name": "f"}]!4Gé'  # gpt2 vocab: BOS not added, so kept


def test_leading_bos_is_dropped_when_the_tokenizer_adds_it():
    src = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    tmpl = ChatTemplate.from_gguf(
        meta(**{"tokenizer.chat_template": src, "tokenizer.ggml.add_bos_token": True})
    )
    assert tmpl.render([{"role": "user", "content": "x"}]) == "x"


def test_content_parts_and_none_are_flattened():
    tmpl = ChatTemplate.builtin("chatml")
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    msgs = [{"role": "user", "content": parts}, {"role": "assistant", "content": None}]
    want = "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
    assert tmpl.render(msgs, add_generation_prompt=False) == want


@pytest.mark.parametrize(
    "name, expected",
    [
        (
            "chatml",
            "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "llama3",
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "llama2-sys",
            "[INST] <<SYS>>\n Be brief. \n<</SYS>>\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]",
        ),
        (
            "mistral-v7",
            "[SYSTEM_PROMPT]  Be brief. [/SYSTEM_PROMPT][INST] Hi[/INST] Hello!</s>[INST] Bye[/INST]",
        ),
        (
            "phi3",
            "<|system|>\n Be brief. <|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n"
            "<|assistant|>\n",
        ),
    ],
)
def test_builtin_templates_match_llama_cpp_formats(name, expected):
    assert ChatTemplate.builtin(name).render(CONVO) == expected


def test_every_builtin_renders_and_is_detected_as_itself():
    for name in builtin_template_names():
        assert ChatTemplate.builtin(name).render(CONVO)
    assert detect_template(CHATML_GGUF) == "chatml"
    assert detect_template("{{ '<start_of_turn>' }}") == "gemma"
    assert detect_template("{{ '<|start_header_id|>' + '<|end_header_id|>' }}") == "llama3"
    assert detect_template("nothing known") is None


def test_fallback_choice_by_architecture_and_vocabulary():
    assert fallback_template_name("gemma3", []) == "gemma"
    assert fallback_template_name("llama", ["<|start_header_id|>"]) == "llama3"
    assert fallback_template_name("qwen2", ["<|im_start|>"]) == "chatml"
    assert fallback_template_name("phi3", []) == "phi3"
    assert fallback_template_name("llama", ["<s>", "</s>", "[INST]"]) == "mistral-v3"
    assert fallback_template_name("llama", ["<s>", "</s>"]) == "llama2"
    assert fallback_template_name("mystery", []) == "chatml"


def test_override_by_name_file_or_text(tmp_path):
    m = meta(**{"tokenizer.chat_template": CHATML_GGUF})
    assert ChatTemplate.from_gguf(m, override="gemma").name == "gemma"
    f = tmp_path / "mine.jinja"
    f.write_text("{% for m in messages %}[{{ m.role }}]{% endfor %}", encoding="utf-8")
    tmpl = ChatTemplate.from_gguf(m, override=str(f))
    assert tmpl.name == "mine.jinja" and tmpl.render([{"role": "user", "content": "x"}]) == "[user]"
    assert ChatTemplate.from_gguf(m, override="{{ 'T' }}").render([]) == "T"
    with pytest.raises(TemplateError, match="unknown chat template 'nope'"):
        ChatTemplate.from_gguf(m, override="nope")


def test_render_failures_are_template_errors_naming_the_template():
    source = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    )
    m = meta(**{"tokenizer.chat_template": source})
    with pytest.raises(
        TemplateError, match="chat template 'gguf' refused the conversation: system first"
    ):
        ChatTemplate.from_gguf(m).render([{"role": "user", "content": "x"}])
    with pytest.raises(TemplateError, match="chat template 'gguf' is not valid Jinja"):
        ChatTemplate.from_gguf(meta(**{"tokenizer.chat_template": "{% for %}"})).render([])
    with pytest.raises(TemplateError, match="failed to render"):
        ChatTemplate("{{ (1).__class__.__subclasses__() }}", "t").render([])  # the sandbox refuses
    with pytest.raises(TemplateError, match="failed to render"):
        ChatTemplate("{{ 1 / 0 }}", "t").render([])
    with pytest.raises(TemplateError):
        ChatTemplate.builtin("chatml").render(["not a dict"])


GPT_OSS_TEMPLATE = Path(__file__).parent / "data" / "templates" / "openai-gpt-oss-120b.jinja"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_gpt_oss_template_renders_harmony():
    """llama.cpp's models/templates/openai-gpt-oss-120b.jinja through our sandbox: system and
    developer headers, the tool namespace, channels, the reasoning of a tool-calling turn
    (reasoning_content read as `thinking`, as llama.cpp passes it) and the tool's answer."""
    tmpl = ChatTemplate(
        GPT_OSS_TEMPLATE.read_text(encoding="utf-8"),
        "gguf",
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
    )
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need the tool.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny"},
    ]
    out = tmpl.render(msgs, tools=[WEATHER_TOOL])
    assert out.startswith("<|start|>system<|message|>You are ChatGPT")
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools" in out
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in out
    assert "<|start|>user<|message|>Weather?<|end|>" in out
    assert "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>" in out
    assert (
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
    ) in out
    assert (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
        in out
    )
    assert out.endswith("<|start|>assistant")


def test_gpt_oss_template_continues_a_final_answer_with_end():
    """A prompt that ends in a finished answer has <|end|> where the template writes <|return|>
    (llama.cpp common_chat_params_init_gpt_oss)."""
    tmpl = ChatTemplate(GPT_OSS_TEMPLATE.read_text(encoding="utf-8"), "gguf")
    out = tmpl.render(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        add_generation_prompt=False,
    )
    assert out.endswith("<|start|>assistant<|channel|>final<|message|>Hello<|end|>")
    assert "<|return|>" not in out
