"""The timing sources side by side, written as a documentation page.

``python -m replay.tools.timing_sources [--out docs/timing-sources.md] [--frameworks vllm,...]``
prices the standard batch shapes of :mod:`replay.timing.shapes` and writes, with the
command, date and commit that produced them:

1. on A100, ``timing=aiconfigurator`` (each framework's kernel tables) against
   ``timing=vidur`` for the models Vidur's profiles cover: Llama-2-70B on two GPUs,
   Llama-2-7B and Llama-3-8B on one (Vidur's attention table is derived for the last two,
   as ``timing.vidur`` records);
2. on the RTX PRO 6000, ``timing=layer_profile`` (the measured per-layer profile) against
   ``timing=aiconfigurator`` for Llama-3.1-8B, the two sources this GPU has;
3. ``kv=vllm_profile`` against the KV cache vLLM reported in each real run's meta.json
   under ``data_dir/vllm_logs`` that records one, with the difference in blocks and bytes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate

from replay.config import compose_config
from replay.config.cli import CommandParser, run_or_exit
from replay.storage.outputs import atomic_write_text, ensure_writable_dir, git_describe
from replay.timing.aiconfigurator_timing import FRAMEWORKS
from replay.timing.shapes import standard_shapes

#: (model, hardware) pairs on A100 that Vidur's profiles cover.
VIDUR_PAIRS = (("llama2_70b", "a100x2"), ("llama2_7b", "a100x1"), ("llama3_8b", "a100x1"))
#: The GPU with both a per-layer profile and kernel tables, and its model.
BOTH_SOURCES = ("llama3_1_8b", "rtxpro6000x1")
#: The real runs' folders: ``<gpu>/<model>/vllm/meta.json`` under ``data_dir/vllm_logs/*/``.
HARDWARE_OF_RUN = {"RTX4090": "rtx4090x1", "RTXPRO6000": "rtxpro6000x1"}
MODEL_OF_RUN = {"meta-llama/Llama-3.1-8B": "llama3_1_8b"}


def _timing(model: str, hardware: str, timing: str, overrides=()):
    return instantiate(compose_config([f"model={model}", f"hardware={hardware}",
                                       f"timing={timing}", *overrides]).timing)


def price_shapes(timing) -> pd.Series:
    """Milliseconds of every standard shape."""
    return pd.Series({name: timing.duration(shape) * 1e3
                      for name, shape in standard_shapes().items()})


def _percent(x: float) -> str:
    return f"{x:+.1%}"


def _share(x: float) -> str:
    return f"{x:.1%}"


def _mib(x: float) -> str:
    return f"{x / 2**20:,.0f} MiB"


def _markdown(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


def against_vidur(frameworks) -> tuple[str, pd.DataFrame]:
    """Per model, a table of Vidur's and each framework's milliseconds and relative errors."""
    sections, summary = [], []
    for model, hardware in VIDUR_PAIRS:
        vidur = _timing(model, hardware, "vidur")
        reference = price_shapes(vidur)
        attention = vidur.describe()["attention"]
        table = pd.DataFrame({"shape": reference.index, "vidur ms": reference.round(2).values})
        for framework in frameworks:
            kernel = _timing(model, hardware, "aiconfigurator",
                             [f"timing.framework={framework}"])
            prices = price_shapes(kernel)
            error = prices / reference - 1
            table[f"{framework} ms"] = prices.round(2).values
            table[f"{framework} vs vidur"] = [_percent(e) for e in error]
            summary.append({"model": model, "hardware": hardware, "framework": framework,
                            "version": kernel.resolved_version,
                            "median abs error": _share(float(np.median(np.abs(error)))),
                            "max abs error": _share(float(np.max(np.abs(error)))),
                            "prefill shapes, median": _percent(float(np.median(
                                error[error.index.str.startswith("prefill")]))),
                            "decode shapes, median": _percent(float(np.median(
                                error[error.index.str.startswith("decode")])))})
        what = attention.get("what") or attention.get("source")
        sections.append(f"### {model} on {hardware}\n\nVidur's attention table: {what}.\n\n"
                        + _markdown(table))
    return "\n\n".join(sections), pd.DataFrame(summary)


def profile_against_kernels() -> str:
    model, hardware = BOTH_SOURCES
    profile = price_shapes(_timing(model, hardware, "layer_profile"))
    kernel_timing = _timing(model, hardware, "aiconfigurator")
    kernels = price_shapes(kernel_timing)
    table = pd.DataFrame({"shape": profile.index, "layer_profile ms": profile.round(2).values,
                          f"aiconfigurator ({kernel_timing.framework} "
                          f"{kernel_timing.resolved_version}) ms": kernels.round(2).values,
                          "aiconfigurator vs layer_profile": [
                              _percent(e) for e in kernels / profile - 1]})
    return _markdown(table)


def kv_against_runs(data_dir: Path) -> str:
    rows = []
    for meta_path in sorted(data_dir.glob("vllm_logs/*/*/*/vllm/meta.json")):
        meta = json.loads(meta_path.read_text())
        cache = meta.get("kv_cache") or {}
        hardware = HARDWARE_OF_RUN.get(meta_path.parts[-4])
        model = MODEL_OF_RUN.get(meta.get("model"))
        if not cache.get("num_gpu_blocks") or hardware is None or model is None:
            continue
        engine = meta["engine_kwargs"]
        kv = instantiate(compose_config([
            f"model={model}", f"hardware={hardware}", "kv=vllm_profile",
            f"kv.gpu_memory_utilization={cache['gpu_memory_utilization']}",
            f"kv.max_num_batched_tokens={engine['max_num_batched_tokens']}",
            f"kv.max_num_seqs={engine['max_num_seqs']}",
            f"kv.block_size={cache['block_size']}"]).kv)
        detail = kv.detail
        blocks, page = cache["num_gpu_blocks"], detail["page_size_bytes_per_layer"]
        per_block = page * instantiate(compose_config([f"model={model}"]).model).num_layers
        # vLLM's non-KV memory beside the weights lies in one block's width below this:
        implied = (detail["requested_bytes"] - detail["weight_bytes_per_gpu"]
                   - blocks * per_block)
        rows.append({
            "run": str(meta_path.relative_to(data_dir).parent.parent),
            "vLLM blocks (meta.json)": f"{blocks:,}",
            "kvsched blocks": f"{kv.tokens // kv.block_size:,}",
            "difference": _percent(kv.tokens / kv.block_size / blocks - 1),
            "kvsched activation estimate": _mib(detail["activation_peak_bytes"]),
            "vLLM's non-KV memory beside the weights": f"{_mib(implied)} to "
                                                     f"{_mib(implied + per_block)}"})
    if not rows:
        return "No run folder under the data directory records its KV cache."
    return _markdown(pd.DataFrame(rows))


def page(frameworks) -> str:
    data_dir = Path(compose_config([]).data_dir)
    vidur_tables, summary = against_vidur(frameworks)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m replay.tools.timing_sources" + (
        f" --frameworks {','.join(frameworks)}" if tuple(frameworks) != FRAMEWORKS else "")
    return f"""<!-- Generated by `{command}`; do not edit: rerun it. -->
# Timing sources compared

Generated {stamp} by `{command}` (kvsched commit {git_describe()}). Every price is a
backend's `duration()` of the standard batch shapes of `python -m replay.tools.shapes`
(prefill of 1 to 8 requests, decode of 1 to 128 requests at several contexts), in
milliseconds; what each backend is and how it composes a step is in
[Timing backends](timing.md).

## Kernel tables against Vidur on A100

`timing=aiconfigurator` with each framework's A100 tables against `timing=vidur`
(relative error of the kernel tables, taking Vidur as the reference). Summary:

{_markdown(summary)}

{vidur_tables}

## Per-layer profile against kernel tables on the RTX PRO 6000

Llama-3.1-8B, one GPU: `timing=layer_profile` (the measured profile of the shared data)
against `timing=aiconfigurator` (vLLM tables).

{profile_against_kernels()}

## KV capacity: `kv=vllm_profile` against the real runs

For each real vLLM run whose meta.json records its KV cache, `kv=vllm_profile` with the
run's model, GPU, `gpu_memory_utilization`, `max_num_batched_tokens`, `max_num_seqs` and
block size, against the blocks vLLM reported. The last column is what vLLM's blocks
leave for its measured activation peak and other non-KV memory once the weights are
subtracted (the run's meta.json does not break it down).

{kv_against_runs(data_dir)}
"""


def framework_list(text: str) -> tuple[str, ...]:
    """``--frameworks``: some of :data:`FRAMEWORKS`, comma-separated."""
    frameworks = tuple(f for f in text.split(",") if f)
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown or not frameworks:
        raise argparse.ArgumentTypeError(f"{','.join(unknown) or 'nothing'} is not one of "
                                         f"{','.join(FRAMEWORKS)}")
    return frameworks


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m replay.tools.timing_sources", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/timing-sources.md"))
    parser.add_argument("--frameworks", type=framework_list, default=FRAMEWORKS,
                        help=f"aiconfigurator frameworks to compare with Vidur, comma-separated "
                             f"(of {','.join(FRAMEWORKS)})")
    args = parser.parse_args(argv)
    ensure_writable_dir(args.out.parent)  # before the work, not after it
    text = page(args.frameworks)
    atomic_write_text(args.out, text)
    print(text)
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_or_exit(main))
