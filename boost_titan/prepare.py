"""Tokenize a corpus once into a prepared dataset folder that training reads by memory map.

    python -m boost_titan.prepare --tokenizer TOK --out DIR [--workers N] INPUT...

INPUT: .jsonl/.json/.parquet/.txt files (the text formats also .gz/.bz2/.xz/.zst-compressed),
folders (searched recursively) or globs. TOK: what `--model.hf_assets_path` takes. Train on
the folder with `--training.dataset_path DIR`, or blend several with `--boost.data_mix
"web=DIR1:0.7,code=DIR2:0.3"` (docs/datasets.md). Rerunning the same command after an
interruption finishes the folder; the bytes do not depend on `--workers`. Exit status: 0; 2
and one `error:` line (bad input: nothing is left in DIR; a worker's death or a full
disk: the finished shards stay, rerun to resume); 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker process


def parse(argv: list[str] | None) -> argparse.Namespace:
    from boost_titan.data.corpus import HELD_OUT_PERCENT
    from boost_titan.data.documents import MAX_DOCUMENT_MB
    from boost_titan.data.prepare_corpus import CHUNK_MB

    parser = argparse.ArgumentParser(
        prog="python -m boost_titan.prepare",
        description="Tokenize corpus files into a prepared dataset folder (docs/datasets.md).",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or globs")
    parser.add_argument(
        "--tokenizer", required=True, help="what --model.hf_assets_path takes ('default', ...)"
    )
    parser.add_argument("--out", required=True, help="the folder to write (new, or to resume)")
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes (default: all cores); 1 prepares in this process",
    )
    parser.add_argument(
        "--shard-mb", type=float, default=CHUNK_MB, help=f"input MB per shard ({CHUNK_MB:g})"
    )
    parser.add_argument(
        "--held-out-percent",
        type=float,
        default=HELD_OUT_PERCENT,
        help=f"percent of documents held out for validation, by text hash ({HELD_OUT_PERCENT})",
    )
    parser.add_argument(
        "--max-document-mb",
        type=float,
        default=MAX_DOCUMENT_MB,
        help=f"the longest document taken; a longer one is refused ({MAX_DOCUMENT_MB:g})",
    )
    parser.add_argument(
        "--separator",
        help="a token to end every document with, for a tokenizer without BOS and EOS",
    )
    parser.add_argument(
        "--text-key",
        default="text",
        metavar="KEY[,KEY...]",
        help="the JSON key or parquet column holding the text; a comma list: the first one a "
        "record holds wins (text)",
    )
    parser.add_argument(
        "--encoding",
        default="utf-8",
        help="how .jsonl/.json/.txt bytes decode, ASCII-compatible (utf-8; e.g. latin-1)",
    )
    return parser.parse_args(argv)


def write(args: argparse.Namespace, plan: dict[str, Any], todo: list[int] | None) -> None:
    """Write the shards still to do (`todo`; None: the folder is complete) with a progress
    bar of shards and tokens/s; exit 130 on Ctrl-C (a rerun finishes the folder)."""
    from tqdm import tqdm

    from boost_titan.data.prepare_corpus import run_chunks

    if not todo:
        return
    total = len(plan["chunks"])
    # on a terminal only, and cleared when it closes: an error stays one line
    bar = tqdm(
        total=total,
        initial=total - len(todo),
        unit="shard",
        file=sys.stderr,
        disable=None,
        leave=False,
    )
    start, tokens = time.perf_counter(), 0
    try:
        for _, counts in run_chunks(Path(args.out).expanduser(), plan, todo, args.workers):
            tokens += counts["tokens"]
            rate = tokens / max(time.perf_counter() - start, 1e-9)
            bar.set_postfix_str(f"{rate / 1e6:.2f}M tokens/s", refresh=False)
            bar.update()
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted: rerun the same command to finish {args.out}", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        bar.close()


def summary(out: str, manifest: dict[str, Any]) -> str:
    """The line printed for a prepared folder."""
    notes = "".join(
        f", {manifest[key]:,} {what}"
        for key, what in (
            ("skipped_records", "records without text skipped"),
            ("lone_surrogates", "lone surrogates replaced by U+FFFD"),
        )
        if manifest.get(key)
    )
    return (
        f"prepared {out}: {manifest['tokens']:,} tokens in {manifest['documents']:,} "
        f"documents ({manifest['dtype']}, {len(manifest['shards'])} shards), "
        f"{manifest['held_out_documents']:,} documents held out{notes}"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    from boost_titan.config.cli import fail
    from boost_titan.config.errors import ConfigError
    from boost_titan.data.documents import Reading, check_encoding, parse_text_keys
    from boost_titan.data.prepare_corpus import (
        Stopped,
        discarded_on_error,
        finish,
        make_plan,
        pending,
    )

    try:
        if args.workers < 1:
            raise ConfigError(f"--workers {args.workers} must be at least 1 (1: in this process)")
        reading = Reading(
            parse_text_keys(args.text_key), check_encoding(args.encoding), args.max_document_mb
        )
        skipped: list[Path] = []
        plan = make_plan(
            args.inputs,
            args.tokenizer,
            args.shard_mb,
            args.held_out_percent,
            args.separator,
            args.out,
            reading,
            skipped,
        )
        if skipped:
            print(
                f"skipped {len(skipped)} prepared folder(s) among the inputs (they hold a "
                f"manifest.json or plan.json): {', '.join(map(str, skipped))}",
                file=sys.stderr,
            )
        todo = pending(plan, args.out)
        with discarded_on_error(plan, args.out):
            write(args, plan, todo)
            manifest = finish(plan, args.out)
    except (ConfigError, Stopped) as e:
        fail(str(e))
    print(summary(args.out, manifest))


if __name__ == "__main__":
    main()
