"""`ggstation tokenize`: like llama-tokenize, one `id -> 'piece'` line per token, or --ids.

Text is taken verbatim from -p, -f FILE or --stdin (no escape processing; file and stdin bytes
are kept as they are, invalid UTF-8 included).
"""

from __future__ import annotations

import argparse
import sys

from .. import params
from ..errors import EngineError
from .common import model_path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tokenize",
        help="show how a model tokenizes text (like llama-tokenize)",
        description="Tokenize text with a model's tokenizer. Prints one 'id -> piece' line per token, "
        "or the id list with --ids. The text is used verbatim: no escape sequences are processed.",
    )
    p.add_argument("-m", "--model", default=None, help="GGUF file or starter model name")
    params.add_hf_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="text to tokenize")
    src.add_argument("-f", "--file", help="read the text from FILE")
    src.add_argument("--stdin", action="store_true", help="read the text from standard input")
    p.add_argument("--ids", action="store_true", help="print only the token ids, as [1, 2, 3]")
    p.add_argument(
        "--no-bos", action="store_true", help="do not add the BOS token the model asks for"
    )
    p.add_argument(
        "--no-parse-special",
        action="store_true",
        help="treat special-token text such as <|im_start|> as plain text",
    )
    p.add_argument(
        "--show-count", action="store_true", help="print the number of tokens at the end"
    )
    p.set_defaults(run=run)


def _read_text(args: argparse.Namespace) -> str | bytes:
    if args.prompt is not None:
        return args.prompt
    if args.stdin:
        return sys.stdin.buffer.read()
    try:
        with open(args.file, "rb") as fh:
            return fh.read()
    except OSError as e:
        raise EngineError(f"cannot read '{args.file}': {e.strerror or e}") from None


def _show(piece: bytes) -> str:
    """A piece for the terminal: UTF-8 as is, other bytes as \\xNN escapes."""
    return piece.decode("utf-8", "backslashreplace")


def run(args: argparse.Namespace) -> int:
    from ..gguf_split import open_gguf
    from ..tokenizer import load_tokenizer

    text = _read_text(args)
    tok = load_tokenizer(open_gguf(model_path(args)))
    add_special = tok.add_bos and not args.no_bos  # llama-tokenize: --no-bos turns add_special off
    ids = tok.encode(text, add_special=add_special, parse_special=not args.no_parse_special)
    out = sys.stdout
    if args.ids:
        out.write("[" + ", ".join(map(str, ids)) + "]\n")
    else:
        for t in ids:
            out.write(f"{t:6d} -> '{_show(tok.token_to_piece(t))}'\n")
    if args.show_count:
        out.write(f"Total number of tokens: {len(ids)}\n")
    out.flush()
    return 0
