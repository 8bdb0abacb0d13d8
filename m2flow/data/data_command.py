"""``m2flow data gsm8k --from FILE... --out DIR``: a data set ready for ``data.kind``, from files the user supplies."""

from __future__ import annotations

import argparse
from pathlib import Path

from m2flow.commands import register_command, say


def _configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="{gsm8k}", required=True)
    gsm8k = sub.add_parser("gsm8k", help="write train.jsonl and test.jsonl for data.kind: gsm8k from downloaded "
                                         "GSM8K files (jsonl or parquet; the split is read from each file name)")
    gsm8k.add_argument("--from", dest="sources", type=Path, nargs="+", required=True, metavar="PATH",
                       help="GSM8K files (train.jsonl, test-00000-of-00001.parquet, ...) or directories holding them")
    gsm8k.add_argument("--out", type=Path, default=Path("data/gsm8k"),
                       help="directory to write (default data/gsm8k, where examples/reasoning/gsm8k_grpo.yaml reads)")


def _run(args: argparse.Namespace) -> int:
    from m2flow.data.gsm8k_prepare import prepare_gsm8k

    counts = prepare_gsm8k(list(args.sources), args.out)
    for split, n in counts.items():
        say(f"{args.out / (split + '.jsonl')}: {n} records")
    if "test" not in counts:
        say("no test split given: training runs without held-out evaluation")
    return 0


register_command("data", "prepare a data set from files you downloaded (m2flow downloads nothing)", _configure, _run)
