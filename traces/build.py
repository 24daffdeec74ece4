"""``python -m traces.build {lmsys,arxiv} --out FILE``: build a length trace from HuggingFace.

Produces the CSV schema the workload configs read:

* ``lmsys`` (``lmsys/lmsys-chat-1m``, gated: accept its licence and log in with
  ``huggingface-cli login`` first): the first user turn is the prompt, the first assistant turn
  after it the response -> columns ``question_length, answer_length`` (as ``workload=lmsys``;
  note the shared file instead sums all turns, see the README);
* ``arxiv`` (``armanc/scientific_papers``, config ``arxiv``): the article is the prompt, the
  abstract the response -> ``num_prefill_tokens, num_decode_tokens, num_total_tokens, pd_ratio``
  (as Vidur's arXiv file; ``pd_ratio`` = prefill / decode).

``--length-unit tokens`` counts tokens with a HuggingFace tokenizer (default Llama-2's, without
special tokens); ``--length-unit words`` counts whitespace-separated words. The column names stay
the same either way; set ``workload.length_unit`` to match. No filtering happens here: zero
lengths and context caps are the workload's job (and are counted there). Conversations without
a user turn followed by an assistant turn are skipped and counted on stderr.

Needs the ``data`` extra (``pip install -e ".[data]"``, the HuggingFace ``datasets``
package; ``transformers`` too for token counts) and internet access, or ``--from-disk DIR``
for a copy saved with ``save_to_disk``: that is how the tests run the whole loading path
offline, on a ``datasets.Dataset`` built in memory.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from pathlib import Path

import pandas as pd

from replay.config.cli import CommandParser, run_or_exit
from replay.errors import InputError

DEFAULT_TOKENIZER = "meta-llama/Llama-2-7b-hf"
HF_DATASETS = {"lmsys": ("lmsys/lmsys-chat-1m", None),
               "arxiv": ("armanc/scientific_papers", "arxiv")}


def word_count(text: str) -> int:
    return len(text.split())


def token_counter(tokenizer_name: str) -> Callable[[str], int]:
    """Number of tokens of a text under a HuggingFace tokenizer, without BOS/EOS."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise SystemExit("--length-unit tokens needs `pip install transformers`") from exc
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def lmsys_pair(record: Mapping) -> tuple[str, str] | str:
    """(first user turn, first assistant turn after it), or why there is none."""
    turns = list(record["conversation"])
    user = next((i for i, t in enumerate(turns) if t["role"] == "user"), None)
    if user is None:
        return "no_user_turn"
    reply = next((t for t in turns[user + 1:] if t["role"] == "assistant"), None)
    if reply is None:
        return "no_assistant_reply"
    return turns[user]["content"], reply["content"]


def arxiv_pair(record: Mapping) -> tuple[str, str]:
    return record["article"], record["abstract"]


def build(records: Iterable[Mapping], dataset: str, count: Callable[[str], int]
          ) -> tuple[pd.DataFrame, Counter]:
    """The length table of ``records`` (HuggingFace rows) and the skipped rows by reason."""
    extract = {"lmsys": lmsys_pair, "arxiv": arxiv_pair}[dataset]
    prompts, outputs, skipped = [], [], Counter()
    for record in records:
        pair = extract(record)
        if isinstance(pair, str):
            skipped[pair] += 1
            continue
        prompts.append(count(pair[0]))
        outputs.append(count(pair[1]))
    if dataset == "lmsys":
        return pd.DataFrame({"question_length": prompts, "answer_length": outputs}), skipped
    frame = pd.DataFrame({"num_prefill_tokens": prompts, "num_decode_tokens": outputs})
    frame["num_total_tokens"] = frame.num_prefill_tokens + frame.num_decode_tokens
    frame["pd_ratio"] = frame.num_prefill_tokens / frame.num_decode_tokens
    return frame, skipped


def load_records(dataset: str, split: str, limit: int | None,
                 from_disk: Path | None = None) -> Iterable[Mapping]:
    """The dataset's records, streamed from the HuggingFace Hub, or read from a copy saved
    with ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``from_disk``)."""
    try:
        import datasets
    except ImportError as exc:
        raise SystemExit('traces.build needs the data extra: pip install -e ".[data]"') from exc
    if from_disk is not None:
        if not from_disk.is_dir():
            raise InputError(f"--from-disk {from_disk}: not a folder (give a folder written by "
                             f"Dataset.save_to_disk)")
        try:
            loaded = datasets.load_from_disk(str(from_disk))
        except (FileNotFoundError, ValueError, OSError) as exc:
            raise InputError(f"--from-disk {from_disk}: not a saved datasets folder "
                             f"({' '.join(str(exc).split())})") from None
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise InputError(f"{from_disk}: no split {split!r} (has {sorted(loaded)})")
            loaded = loaded[split]
        return islice(iter(loaded), limit)
    name, config = HF_DATASETS[dataset]
    return islice(datasets.load_dataset(name, config, split=split, streaming=True), limit)


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(prog="python -m traces.build", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=sorted(HF_DATASETS))
    parser.add_argument("--out", type=Path, required=True, help="CSV file to write")
    parser.add_argument("--length-unit", choices=("tokens", "words"), default="tokens")
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    parser.add_argument("--split", default="train")
    parser.add_argument("--limit", type=int, default=None, help="only the first N records")
    parser.add_argument("--from-disk", type=Path, default=None,
                        help="read a dataset saved with save_to_disk instead of the Hub")
    args = parser.parse_args(argv)
    count = token_counter(args.tokenizer) if args.length_unit == "tokens" else word_count
    frame, skipped = build(load_records(args.dataset, args.split, args.limit, args.from_disk),
                           args.dataset, count)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False)
    print(f"{args.out}: {len(frame)} rows ({args.length_unit}); skipped {dict(skipped)}",
          file=sys.stderr)


if __name__ == "__main__":
    run_or_exit(main)
