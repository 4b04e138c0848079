"""Record llama-tokenize's ids for every BPE pre-tokenizer type we know (not a test: it needs a
local llama.cpp build). Writes tests/data/pretok-smollm2.json, which test_pretokenizers.py checks
our tokenizer against without llama.cpp.

    python tests/compare_pretokenizers.py LLAMA_CPP_DIR [--check-only] [--only NAME,NAME]

--only runs the given names and adds them to the existing file.

SmolLM2's vocabulary (starter model) is copied without tensors for each tokenizer.ggml.pre
(ggufgen.vocab_only_copy). Each text is given to llama-tokenize in a file of its own
(--ids --no-escape --no-parse-special; BOS as the type's default asks). One type of each
distinct setting gets the whole corpus (llama.cpp's models/ggml-vocab-*.inp texts and ours); every
other name gets the first few texts, which shows llama.cpp maps it the same way. Prints each
difference from our tokenizer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from engine.hub import store as model_store  # noqa: E402
from engine.tokenizer import load_tokenizer  # noqa: E402
from engine.tokenizer.bpe import _PRE  # noqa: E402
from ggufgen import vocab_only_copy  # noqa: E402

OUT = HERE / "data" / "pretok-smollm2.json"
N_SHORT = 6  # texts every name gets

OURS = [
    "Hello, World! I'M HERE, YOU'RE it's we'VE THEY'LL he'D don'T 's 't' ''' x's'",
    "She's ÉCOLE'S l'été L'ÉTÉ İ'S K'S camelCase PascalCase HTTPServer XMLHttpRequest iPhone McDONALD's",
    "日本語のテキスト、漢字とカタカナ。中文：你好世界！한국어 텍스트입니다 ㄱㄴㄷ ㄅㄆ",
    "1 12 123 1234 12345 1234567 1000000 3.14159 2,500,000 0x1F ²³ ½ ①② ١٢٣٤ ۱۲۳ abc123def 4567ghi",
    "a  b   c\t\td\n\n\ne \r\n f   trailing   ",
    "🦙 llama 🚀🚀 👨\u200d👩\u200d👧 ❤️ 👍🏽 🇺🇸 e\u0301 a\u0308o n\u0303",
    "Привет мир! Ça va? Größe straße ÆØÅ Ελληνικά ΑΒΓ αβγ Tiếng Việt có dấu",
    "العربية هنا हिन्दी में लिखा गया पाठ ไทยภาษา ຄຳ ខ្មែរ မြန်မာ ꩠ",
    "\u00a0nbsp\u2003em\u3000ideo \x85nel\x1cfs\x1f \u180e\u200bzw \u2028\u2029 \ufeffbom",
    "x\u1c89y \ua7cbz 1\U00010d40\U00010d412 a\u0897b !\u1b4e? $\u20c1 \U000105c0",
    "\U00020000\U0002a6df \uf900\ufa6e\ufa6f \u4e00\u9fff \u3400\u4dbf (中) 中a a中 '中",
    "def f(x):\n    return x**2 + 1  # comment\n\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * 2; } // done",
    '<html><body class="x">Hi</body></html> https://example.com/a?b=c&d=e#f path/to/file.py:12:34',
    "（全角）！？ＡＢＣ１２３「引用」『二重』…—– ・ｶﾀｶﾅ",
    "<|im_start|>user\nhi<|im_end|> <sentinel:12> IMGIMGABZ ALLCAPS MiXeD CaSe ÀÉÎõü",
    "   \n  \n\n   x\r\r\n \t \u00a0\n",
    "Dr. Smith's 10,000-word essay (2nd ed.) costs $12.50/copy — 50% off!",
]


def corpus(llama_dir: Path) -> list[str]:
    texts = list(OURS)
    for name in ("ggml-vocab-gpt-2.gguf.inp", "ggml-vocab-qwen35.gguf.inp"):
        for t in (
            (llama_dir / "models" / name)
            .read_text(encoding="utf-8")
            .split("\n__ggml_vocab_test__\n")
        ):
            if t not in texts:
                texts.append(t)
    return texts


def llama_ids(binary: Path, vocab: Path, text: str, tmp: Path) -> list[int]:
    f = tmp / "text.txt"
    f.write_bytes(text.encode("utf-8"))
    out = subprocess.run(
        [
            str(binary),
            "-m",
            str(vocab),
            "-f",
            str(f),
            "--ids",
            "--no-escape",
            "--no-parse-special",
            "--log-disable",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def representatives() -> set[str]:
    seen: dict[tuple, str] = {}
    for name, pre in _PRE.items():
        seen.setdefault((tuple(pre.exprs), pre.ignore_merges, pre.add_bos, pre.has_bos), name)
    return set(seen.values())


def main() -> None:
    llama_dir = Path(sys.argv[1])
    binary = llama_dir / "build" / "bin" / "llama-tokenize"
    texts = corpus(llama_dir)
    reps = representatives()
    src = model_store.ensure("smollm2")
    rows = [{"text": t, "variants": [], "pre": {}} for t in texts]
    names = sorted(_PRE)
    if "--only" in sys.argv:
        names = sys.argv[sys.argv.index("--only") + 1].split(",")
        rows = json.loads(OUT.read_text(encoding="utf-8"))["results"]
        assert [r["text"] for r in rows] == texts, "the corpus changed: run without --only"
    n_cmp = n_bad = 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in names:
            vocab = vocab_only_copy(src, tmp / "vocab.gguf", name)
            tok = load_tokenizer(str(vocab))
            for i, row in enumerate(rows):
                if name not in reps and i >= N_SHORT:
                    break
                ids = llama_ids(binary, vocab, row["text"], tmp)
                ours = tok.encode(row["text"], add_special=True, parse_special=False)
                n_cmp += 1
                if ours != ids:
                    n_bad += 1
                    print(f"DIFF {name} {row['text']!r}\n  llama {ids}\n  ours  {ours}", flush=True)
                if ids not in row["variants"]:
                    row["variants"].append(ids)
                row["pre"][name] = row["variants"].index(ids)
            print(f"{name}: done", flush=True)
    print(f"{n_cmp} comparisons over {len(names)} names and {len(texts)} texts, {n_bad} differ")
    if "--check-only" not in sys.argv:
        data = {
            "model": src.name,
            "source": "llama-tokenize (llama.cpp 0c1e570) via tests/compare_pretokenizers.py",
            "results": rows,
        }
        OUT.write_text(
            json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8"
        )
        print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
