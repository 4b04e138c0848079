"""-hf brings the repository's mmproj as llama.cpp's does (common/download.cpp find_best_mmproj,
arg.cpp's mmproj_examples): the pairing rule (engine/hub/siblings.py), the listing's companions
online and offline, the download beside the model, --no-mmproj and -mm, the commands that do
not ask for it, a hostile name. Against tests/hub_server.py's local Hub, never the internet."""

from __future__ import annotations

import pytest

import hub_server
from engine import params
from engine.errors import HubError
from engine.hub import client as hub
from engine.hub.pull import pull_paths, resolve_model_paths
from engine.hub.siblings import best_mmproj, best_sibling, quant_bits, quant_tag
from ggufgen import write_tiny_model
from mmprojgen import write_test_image, write_tiny_vlm_pair

# -- the rule, on names --------------------------------------------------------------------------


def test_quant_tag_and_bits_follow_llama_cpp():
    assert quant_tag("gemma-3-4b-it-Q4_K_M.gguf") == "Q4_K_M" and quant_bits("x-Q4_K_M.gguf") == 4
    assert quant_tag("a.q5_k_s.gguf") == "Q5_K_S" and quant_bits("mmproj-model-f16.gguf") == 16
    assert quant_bits("mmproj-BF16.gguf") == 16 and quant_bits("m-IQ4_XS.gguf") == 4
    assert quant_tag("m-Q8_0-00002-of-00003.gguf") == "Q8_0"  # the split suffix is not the tag
    assert quant_tag("x-00001-of-00003.gguf") == "" and quant_bits("mmproj.gguf") == 0
    assert quant_tag("dir.v2/model.gguf") == "" and quant_tag("model.safetensors") == ""


def test_best_mmproj_is_the_closest_quantisation():
    files = ["m-Q4_K_M.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf", "mmproj-BF16.gguf"]
    assert best_mmproj(files, "m-Q4_K_M.gguf") == "mmproj-Q8_0.gguf"  # |8-4| < |16-4|
    assert best_mmproj(files, "m-F16.gguf") == "mmproj-F16.gguf"  # the first of F16/BF16
    assert best_mmproj(files, "m.gguf") == "mmproj-Q8_0.gguf"  # no tag: 0 bits, 8 is closest
    assert best_mmproj(["m-Q4_K_M.gguf", "README.md"], "m-Q4_K_M.gguf") is None
    # llama.cpp's keyword test is case-sensitive, and the name must end in .gguf
    assert best_mmproj(["MMPROJ-Q8_0.gguf", "mmproj-Q8_0.bin"], "m-Q8_0.gguf") is None


def test_best_sibling_tag_exact_match_then_bits():
    files = ["mmproj-m-Q4_0.gguf", "mmproj-m-Q4_K_M.gguf", "mmproj-m-Q8_0.gguf"]
    # with a tag (llama.cpp passes -hf's tag for the draft heads): "-TAG." wins a tie of bits
    assert best_sibling(files, "m-Q4_K_M.gguf", "mmproj", tag="q4_k_m") == "mmproj-m-Q4_K_M.gguf"
    assert best_sibling(files, "m-Q4_K_M.gguf", "mmproj", tag="Q8_0") == "mmproj-m-Q8_0.gguf"
    assert best_sibling(files, "m.gguf", "mmproj", tag="Q5_K_S") == "mmproj-m-Q4_0.gguf"  # bits
    # the projector is asked for without the tag (find_best_mmproj): on a tie of bits the
    # first listed wins, even where a name holds the model's own tag
    assert best_mmproj(files, "m-Q4_K_M.gguf") == "mmproj-m-Q4_0.gguf"
    drafts = ["m-Q4_K_M.gguf", "mtp-m-Q8_0.gguf", "mmproj-m-Q4_0.gguf"]
    assert best_sibling(drafts, "m-Q4_K_M.gguf", "mtp-") == "mtp-m-Q8_0.gguf"


def test_best_sibling_takes_the_models_directory_or_one_above_deepest_first():
    files = [
        "mmproj-Q4_K_M.gguf",  # the root: above the model, bits equal
        "Q4_K_M/mmproj-F16.gguf",  # the model's own directory: deeper wins over bits
        "Q8_0/mmproj-Q4_0.gguf",  # a directory beside the model's: never
        "Q4_K_M/sub/mmproj-Q4_0.gguf",  # below the model's: never
    ]
    assert best_mmproj(files, "Q4_K_M/m-Q4_K_M.gguf") == "Q4_K_M/mmproj-F16.gguf"
    assert best_mmproj(files[:1] + files[2:], "Q4_K_M/m-Q4_K_M.gguf") == "mmproj-Q4_K_M.gguf"
    assert best_mmproj(files[2:], "Q4_K_M/m-Q4_K_M.gguf") is None
    assert best_mmproj(files, "m-Q4_K_M.gguf") == "mmproj-Q4_K_M.gguf"  # a root model: the root


# -- the Hub ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    d = tmp_path_factory.mktemp("mmproj-payloads")
    lm, mm = write_tiny_vlm_pair(d / "vlm", "gemma3")
    return {"small": write_tiny_model(d / "small.gguf", seed=1), "lm": lm, "mm": mm}


@pytest.fixture
def server(tmp_path, monkeypatch, payloads):
    small = payloads["small"]
    repos = {
        "acme/Vision-GGUF": {
            "vis-Q4_K_M.gguf": small,
            "vis-Q8_0.gguf": small,
            "mmproj-vis-F16.gguf": b"projector F16",
            "mmproj-vis-Q8_0.gguf": b"projector Q8_0",
            "README.md": b"# vision",
        },
        "acme/Text-GGUF": {"text-Q4_K_M.gguf": small},
        # a real tiny gemma3 pair; the F16 projector is a decoy that cannot load
        "acme/TinyVLM-GGUF": {
            "tiny-vlm-Q8_0.gguf": payloads["lm"],
            "mmproj-tiny-vlm-Q8_0.gguf": payloads["mm"],
            "mmproj-tiny-vlm-F16.gguf": b"not a projector",
        },
        "acme/Hostile-GGUF": {"h-Q4_K_M.gguf": small, "../mmproj-h-F16.gguf": b"x"},
        "acme/Absolute-GGUF": {"a-Q4_K_M.gguf": small, "/tmp/mmproj-a-F16.gguf": b"x"},
    }
    srv = hub_server.start(tmp_path / "srv", repos)
    monkeypatch.setenv("HF_ENDPOINT", srv.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "LLAMA_ARG_HF_REPO",
        "LLAMA_ARG_HF_FILE",
        "LLAMA_ARG_MMPROJ",
    ):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    yield srv
    srv.stop()


def _gets(srv) -> list[str]:
    """The repository files fetched (GET .../resolve/...), by name."""
    return [e[1].rsplit("/", 1)[-1] for e in srv.log if e[0] == "GET" and "/resolve/" in e[1]]


def _cdn_bytes(srv) -> int:
    return srv.bytes_sent()


def test_listing_keeps_mmproj_as_companions_not_models(server):
    listing = hub.repo("acme/Vision-GGUF")
    assert [f.filename for f in listing.files] == ["vis-Q4_K_M.gguf", "vis-Q8_0.gguf"]
    assert [f.filename for f in listing.companions] == [
        "mmproj-vis-F16.gguf",
        "mmproj-vis-Q8_0.gguf",
    ]
    assert all(c.size and c.parts[0].sha256 for c in listing.companions)
    found = {r.repo_id: r for r in hub.search("GGUF")}
    assert len(found["acme/Vision-GGUF"].companions) == 2 and not found["acme/Text-GGUF"].companions


def test_hf_pulls_the_closest_mmproj_beside_the_model(server):
    model, mmproj = hub.resolve_with_mmproj("acme/Vision-GGUF")
    assert model.filename == "vis-Q4_K_M.gguf" and mmproj is not None
    assert mmproj.filename == "mmproj-vis-Q8_0.gguf" and mmproj.local_path is None
    paths = pull_paths("acme/Vision-GGUF", mmproj=True)
    assert paths.model.name == "vis-Q4_K_M.gguf" and paths.mmproj is not None
    assert paths.mmproj.parent == paths.model.parent  # the same snapshot
    assert paths.mmproj.read_bytes() == b"projector Q8_0"
    assert "mmproj-vis-F16.gguf" not in str(server.log)  # the other one is never fetched
    sent = _cdn_bytes(server)
    again = pull_paths("acme/Vision-GGUF", mmproj=True)  # both cached: nothing moves
    assert again == paths and _cdn_bytes(server) == sent
    # the -hf tag picks the model; its quantisation then picks the projector
    assert hub.resolve_with_mmproj("acme/Vision-GGUF:Q8_0")[1].filename == "mmproj-vis-Q8_0.gguf"


def test_a_search_results_companion_downloads_by_its_name(server):
    (vision,) = [r for r in hub.search("GGUF") if r.repo_id == "acme/Vision-GGUF"]
    f16 = vision.companions[0]
    assert f16.revision == "main" and f16.size is None  # looked up again for size and sha256
    assert hub.download(f16).read_bytes() == b"projector F16"


def test_offline_pairs_from_the_cached_snapshot(server, monkeypatch):
    pull_paths("acme/Text-GGUF", mmproj=True)
    only_model = pull_paths("acme/Vision-GGUF:Q8_0")  # no projector asked for
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, mmproj = hub.resolve_with_mmproj("acme/Vision-GGUF:Q8_0")
    assert model.local_path == only_model.model and mmproj is None  # none was cached: no error
    monkeypatch.delenv("HF_HUB_OFFLINE")
    online = pull_paths("acme/Vision-GGUF:Q8_0", mmproj=True)
    server.stop()  # the Hub is gone: the cache answers
    assert pull_paths("acme/Vision-GGUF:Q8_0", mmproj=True) == online
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pull_paths("acme/Vision-GGUF:Q8_0", mmproj=True).mmproj == online.mmproj
    assert pull_paths("acme/Text-GGUF", mmproj=True).mmproj is None


def test_a_repo_without_mmproj_gives_no_projector(server):
    assert hub.resolve_with_mmproj("acme/Text-GGUF")[1] is None
    paths = pull_paths("acme/Text-GGUF", mmproj=True)
    assert paths.model.name == "text-Q4_K_M.gguf" and paths.mmproj is None


def test_a_hostile_mmproj_name_refuses_the_listing(server, tmp_path):
    for repo_id, name in (("acme/Hostile-GGUF", "../"), ("acme/Absolute-GGUF", "/tmp/")):
        for call in (hub.resolve, hub.resolve_with_mmproj):
            with pytest.raises(HubError, match="unsafe file name") as e:
                call(repo_id)
            assert e.value.reason == HubError.HUB and name in str(e.value)
    assert not _gets(server)  # nothing fetched, so nothing written anywhere
    assert not list(tmp_path.rglob("mmproj-*.gguf"))


def _p(repo: str, **kw) -> params.CommonParams:
    return params.CommonParams(hf_repo=repo, n_ctx=128, **kw)


def test_commands_ask_for_the_projector_unless_mm_or_no_mmproj(server, tmp_path):
    from engine.commands.common import model_and_projector

    path, p = model_and_projector(_p("acme/Vision-GGUF", mmproj_auto=False))  # --no-mmproj
    assert path.name == "vis-Q4_K_M.gguf" and p.mmproj is None
    assert not any("mmproj" in name for name in _gets(server))
    mine = str(tmp_path / "mine-mmproj.gguf")
    path, p = model_and_projector(_p("acme/Vision-GGUF", mmproj=mine))  # -mm FILE
    assert p.mmproj == mine and not any("mmproj" in name for name in _gets(server))
    path, p = model_and_projector(_p("acme/Vision-GGUF"))
    assert p.mmproj is not None and p.mmproj.endswith("mmproj-vis-Q8_0.gguf")
    assert params.init_params(p, 1).mmproj == p.mmproj  # what init_from_params loads
    # -m is a path: llama.cpp pairs only -hf's (the app pairs a folder's itself)
    local = resolve_model_paths(params.ModelSource(model=str(path)), mmproj=True)
    assert local.model == path and local.mmproj is None


def test_info_does_not_download_the_projector(server, capsys):
    from engine.cli import main

    assert main(["info", "-hf", "acme/Vision-GGUF", "-c", "128"]) == 0
    assert "vis-Q4_K_M.gguf" in capsys.readouterr().out
    assert set(_gets(server)) == {"vis-Q4_K_M.gguf"}  # its header (fit), then the file


def test_generate_hf_with_an_image_uses_the_repos_projector(server, tmp_path, capsys):
    from engine.cli import main

    image = tmp_path / "img.png"
    write_test_image(image, 48, 40, seed=3)
    argv = ["generate", "-hf", "acme/TinyVLM-GGUF", "-p", "what is it", "-n", "2"]
    argv += ["--temp", "0", "-c", "256", "--image", str(image)]
    assert main(argv) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "mmproj-tiny-vlm-Q8_0.gguf" in err  # the download was shown
    assert set(_gets(server)) == {"mmproj-tiny-vlm-Q8_0.gguf", "tiny-vlm-Q8_0.gguf"}
    # --no-mmproj: the text model alone, and --image says what is missing
    assert main(argv + ["--no-mmproj"]) == 1
    assert "needs a multimodal projector" in capsys.readouterr().err
