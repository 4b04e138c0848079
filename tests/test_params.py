"""The shared parameter parser: llama.cpp names, defaults, groups and errors (exit status 1)."""

import math

import pytest

from engine import params
from engine.errors import EngineError
from engine.hub.pull import resolve_model_path
from engine.sampling import SamplingParams


def make_parser(chat=True):
    p = params.ArgumentParser(prog="test")
    params.add_common_args(p)
    if chat:
        params.add_chat_args(p)
    return p


def parse(*argv):
    return make_parser().parse_args(list(argv))


def common(args) -> params.CommonParams:
    return params.common_params(args)


def usage_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 1
    return capsys.readouterr().err


def test_defaults_are_llama_cpp_defaults():
    a = parse()
    assert (a.ctx_size, a.batch_size, a.ubatch_size, a.n_predict, a.threads) == (
        4096,
        2048,
        512,
        -1,
        -1,
    )
    assert (a.cache_type_k, a.cache_type_v, a.keep, a.parallel) == ("f16", "f16", 0, 1)
    assert not a.context_shift and a.jinja and a.model is None and a.stop == []
    assert params.to_sampling_params(a) == SamplingParams()


def test_short_and_long_names():
    a = parse(
        "-m",
        "x.gguf",
        "-c",
        "0",
        "-n",
        "32",
        "-b",
        "64",
        "-ub",
        "32",
        "-t",
        "2",
        "-s",
        "7",
        "-np",
        "2",
        "-ctk",
        "f32",
        "-ctv",
        "F32",
        "-sys",
        "be brief",
        "--keep",
        "-1",
        "--context-shift",
        "-p",
        "hi",
        "-r",
        "STOP",
        "-r",
        "END",
    )
    assert (a.model, a.ctx_size, a.n_predict, a.batch_size, a.ubatch_size) == (
        "x.gguf",
        0,
        32,
        64,
        32,
    )
    assert (a.threads, a.seed, a.parallel, a.cache_type_k, a.cache_type_v) == (
        2,
        7,
        2,
        "f32",
        "f32",
    )
    assert (a.system_prompt, a.keep, a.context_shift, a.prompt) == ("be brief", -1, True, "hi")
    assert a.stop == ["STOP", "END"]
    assert not parse("--no-jinja").jinja


def test_sampling_flags_map_to_params():
    a = parse(
        "--temp",
        "0.5",
        "--top-k",
        "10",
        "--top-p",
        "0.9",
        "--min-p",
        "0.1",
        "--typical",
        "0.7",
        "--repeat-penalty",
        "1.1",
        "--repeat-last-n",
        "-1",
        "--presence-penalty",
        "0.2",
        "--frequency-penalty",
        "0.3",
        "-s",
        "42",
        "--ignore-eos",
        "-l",
        "15043+1",
        "--logit-bias",
        "2-inf",
        "-l",
        "15043+0.5",
    )
    p = params.to_sampling_params(a)
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.5, 10, 0.9, 0.1, 0.7)
    assert (p.repeat_penalty, p.repeat_last_n, p.presence_penalty, p.frequency_penalty) == (
        1.1,
        -1,
        0.2,
        0.3,
    )
    assert p.seed == 42 and p.ignore_eos
    assert p.logit_bias == {15043: 1.5, 2: -math.inf}


def test_negative_temperature_is_greedy():
    p = params.to_sampling_params(parse("--temp", "-5"))
    assert p.temperature == -5 and p.greedy


def test_to_context_params():
    cp = params.to_context_params(
        common(parse("-c", "0", "-b", "128", "-ub", "512", "-ctk", "f32"))
    )
    assert (cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.type_k, cp.type_v) == (0, 128, 128, "f32", "f16")
    assert (cp.n_seq_max, cp.kv_unified) == (1, False)
    cp = params.to_context_params(common(parse("-np", "-1")))
    assert (cp.n_seq_max, cp.kv_unified) == (4, True)


def test_common_params_are_the_flags_typed():
    parser = make_parser()
    params.add_gpu_args(parser)
    params.add_mem_check_arg(parser)
    p = common(
        parser.parse_args(
            [
                "-m",
                "x.gguf",
                "-c",
                "0",
                "-np",
                "-1",
                "-t",
                "2",
                "--keep",
                "-1",
                "-f",
                "p.txt",
                "-r",
                "STOP",
                "--no-jinja",
                "--temp",
                "0",
                "--no-mem-check",
                "-ngl",
                "3",
            ]
        )
    )
    assert (p.model, p.n_ctx, p.n_parallel, p.n_slots, p.n_threads, p.n_keep) == (
        "x.gguf",
        0,
        -1,
        4,
        2,
        -1,
    )
    assert (p.prompt_file, p.antiprompt, p.use_jinja, p.mem_check, p.n_gpu_layers) == (
        "p.txt",
        ("STOP",),
        False,
        False,
        3,
    )
    assert p.sampling.greedy and common(parse()) == params.CommonParams()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["-c", "-1"], "-c/--ctx-size"),
        (["-c", "abc"], "integer"),
        (["-n", "-2"], ">= -1"),
        (["-b", "0"], ">= 1"),
        (["-np", "0"], "-np/--parallel"),
        (["-ctk", "q8_0"], "not supported"),
        (["-ctv", "int3"], "unknown cache type"),
        (["--temp", "nan"], "finite"),
        (["--repeat-last-n", "-2"], ">= -1"),
        (["-l", "15043"], "TOKEN_ID(+/-)BIAS"),
        (["-l", "abc+1"], "TOKEN_ID(+/-)BIAS"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_values_are_usage_errors(capsys, argv, words):
    assert words in usage_error(capsys, *argv)


def test_help_groups_like_llama_cpp():
    text = make_parser().format_help()
    for title in ("common params:", "sampling params:", "example-specific params:"):
        assert title in text
    body = text[text.index("common params:") :]  # skip the usage line
    assert body.index("--ctx-size") < body.index("sampling params:") < body.index("--top-k")
    assert body.index("--top-k") < body.index("example-specific params:") < body.index("--jinja")


def test_parse_logit_bias():
    assert params.parse_logit_bias("15043+1") == (15043, 1.0)
    assert params.parse_logit_bias("15043-1.5") == (15043, -1.5)
    assert params.parse_logit_bias("7-inf") == (7, -math.inf)


def test_read_prompt(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("from file", encoding="utf-8")
    assert params.read_prompt(common(parse("-p", "hello"))) == "hello"
    assert params.read_prompt(common(parse("-f", str(f)))) == "from file"
    assert params.read_prompt(common(parse())) is None
    with pytest.raises(EngineError, match="not both"):
        params.read_prompt(common(parse("-p", "x", "-f", str(f))))
    with pytest.raises(EngineError, match="cannot read"):
        params.read_prompt(common(parse("-f", str(tmp_path / "missing.txt"))))


def test_chat_template_override(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ x }}", encoding="utf-8")
    assert params.chat_template_override(common(parse("--chat-template", "chatml"))) == "chatml"
    assert params.chat_template_override(common(parse("--chat-template-file", str(f)))) == "{{ x }}"
    assert params.chat_template_override(common(parse())) is None
    with pytest.raises(EngineError, match="not both"):
        params.chat_template_override(
            common(parse("--chat-template", "a", "--chat-template-file", str(f)))
        )


def test_missing_model_is_a_clear_error():
    with pytest.raises(EngineError, match="-m/--model"):
        resolve_model_path(params.model_source(parse()))


def test_defaults_namespace_for_the_gui():
    d = params.defaults()
    assert d.ctx_size == 4096 and d.system_prompt is None
    assert params.to_sampling_params(d) == SamplingParams()
    assert params.to_sampling_params(params.defaults(["--temp", "0"])).greedy


def test_extra_sampler_flags():
    p = params.to_sampling_params(
        parse(
            "--top-nsigma",
            "1.5",
            "--xtc-probability",
            "0.5",
            "--xtc-threshold",
            "0.2",
            "--dynatemp-range",
            "0.3",
            "--dynatemp-exp",
            "2",
            "--sampling-seq",
            "kxt",
        )
    )
    assert (
        p.top_n_sigma,
        p.xtc_probability,
        p.xtc_threshold,
        p.dynatemp_range,
        p.dynatemp_exponent,
    ) == (1.5, 0.5, 0.2, 0.3, 2.0)
    assert p.samplers == ("top_k", "xtc", "temperature")
    assert params.to_sampling_params(parse("--samplers", "min_p;temp")).samplers == (
        "min_p",
        "temperature",
    )
