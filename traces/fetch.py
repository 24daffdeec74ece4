"""``python -m traces.fetch --data-dir DIR``: download the data files from their public origins.

Trace files go to ``DIR/traces/``; the Vidur A100 profiles listed in
:mod:`replay.timing.profiles_fetch` go to ``DIR/vidur/profiling/`` (``--only``
picks one of the two).

Each file is fetched with pooch from a commit-pinned GitHub raw URL and checked against the
SHA-256 of the copy the project was developed with; a file already present with the right hash
is left alone. Needs internet access (it cannot run on the offline build machine).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pooch

from replay.data import RemoteFile
from replay.errors import InputError
from replay.outputs import ensure_writable_dir

_VIDUR = "microsoft/vidur"
TRACE_FILES: tuple[RemoteFile, ...] = (
    RemoteFile("traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", _VIDUR,
               "6d98aa8f71696520acc603d87439e77cc78160a7",
               "data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
               "9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc", 884_932),
    RemoteFile("traces/splitwise_conv.csv", _VIDUR, "8e54dd5c137a9b5aa0b6ff512ace6cc7caf8a377",
               "data/processed_traces/splitwise_conv.csv",
               "439e4138b7e384f316de614c071f7162be05b8af0cef866f82faacd1b0472249", 382_729),
    RemoteFile("traces/splitwise_code.csv", _VIDUR, "4f9167b6e76099943b2a8195cb1fcac7d693ead9",
               "data/processed_traces/splitwise_code.csv",
               "f266b907d109d471c61283ab69771c17ad79a18b33ff6e96aa546346f52767a6", 166_195),
    RemoteFile("traces/lmsys_chat_1m_words_in_lt257_out_lt257.csv", "Luoxiaogan/vidur_or",
               "aa5e1571214b75a08a040638bda43bf83402cd03",
               "lmsys_chat_1m_dataset/output_trace/input<257_output<257.csv",
               "626612facf53f4d67b5aecb9b27da7cb1245bb0a8df67a2abcd0fc4c658f1444", 4_028_459),
    # Mooncake FAST'25 traces (Apache-2.0), pinned to commits of the origin that hold them.
    RemoteFile("traces/mooncake/conversation_trace.jsonl", "kvcache-ai/Mooncake",
               "a2a4b18ac537fd798d50e6e9f57031ce86419a37",
               "FAST25-release/traces/conversation_trace.jsonl",
               "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3_029_533),
    RemoteFile("traces/mooncake/synthetic_trace.jsonl", "kvcache-ai/Mooncake",
               "3cca71daccf2a7afb8fe3f0295358f70e3a69fdb",
               "FAST25-release/traces/synthetic_trace.jsonl",
               "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131", 1_136_313),
    # The commit and path of this one could not be confirmed offline: the hash check decides.
    RemoteFile("traces/sharegpt_val_10k_llama2.csv", "AKafakA/vidur_opt_scheduler", "main",
               "data/trace_data/sharegpt/sharegpt_val_10k_llama2.csv",
               "e8eb6769b07f47a44fcb8caecf78dfc247103d65f84c4053bd9ae593caa01c63", 278_423),
)


class FetchError(InputError, RuntimeError):
    """A download failed or did not match the expected file (reported as bad input: the
    network or the origin, not this code)."""



#: ``downloader(url, output_file, pooch)``, as :func:`pooch.retrieve` calls it; ``None`` is
#: pooch's own HTTP downloader.
Downloader = Callable[[str, str, object], None]


def fetch(files: Iterable[RemoteFile], data_dir: Path,
          downloader: Downloader | None = None) -> list[Path]:
    """Download ``files`` into ``data_dir`` with :func:`pooch.retrieve`; return their paths.

    A file already there with the expected SHA-256 is left alone (pooch does not
    download it again); otherwise pooch downloads to a temporary name in the same
    folder and moves it into place only once its hash matches, so an interrupted or
    wrong download never looks like the real file. A hash that does not match is an
    error naming the file.
    """
    paths = []
    for remote in files:
        target = Path(data_dir).expanduser() / remote.relpath
        paths.append(target)
        ensure_writable_dir(target.parent)  # a folder we cannot write is not a download error
        try:
            pooch.retrieve(remote.url, known_hash=f"sha256:{remote.sha256}",
                           fname=target.name, path=target.parent, downloader=downloader,
                           progressbar=False)
        except ValueError as exc:  # pooch's hash mismatch
            raise FetchError(f"{remote.url}: the download does not match the expected "
                             f"SHA-256 {remote.sha256} for {remote.relpath} ({exc}); the "
                             f"origin has changed, see the README's 'Data directory' "
                             f"section") from exc
        except OSError as exc:  # requests' errors are OSErrors too
            raise FetchError(f"{remote.url}: download failed ({exc})") from exc
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m traces.fetch", description=__doc__)
    parser.add_argument("--data-dir", default=os.environ.get("KVSCHED_DATA_DIR"),
                        help="data directory (default: $KVSCHED_DATA_DIR)")
    parser.add_argument("--only", choices=("traces", "profiles"),
                        help="fetch only the traces or only the Vidur profiles")
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("give --data-dir or set KVSCHED_DATA_DIR")
    # Imported here: the profile list lives with the timing backend, which imports this module.
    from replay.timing.profiles_fetch import PROFILE_FILES

    files = {"traces": TRACE_FILES, "profiles": PROFILE_FILES}
    chosen = [files[args.only]] if args.only else list(files.values())
    for path in fetch([f for group in chosen for f in group], Path(args.data_dir)):
        print(path)


if __name__ == "__main__":
    from replay.cli import run_or_exit

    run_or_exit(main)
