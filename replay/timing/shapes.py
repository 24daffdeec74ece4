"""Standard batch shapes and the typical iteration of a B experiment, priced by the timing
backends, and the decomposition of a price into its parts (the library behind
``python -m replay.tools.shapes``, which documents the command)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hydra.utils import instantiate

from replay.config.cli import compose
from replay.engine.timing import BatchShape
from replay.errors import ConfigError
from replay.timing.vidur_tables import TOKEN_OPS, TOKEN_ROUNDING

MODEL_HARDWARE = (("llama2_70b", "a100x2"), ("llama2_7b", "a100x1"))


def compose_timing(model: str, hardware: str, overrides=(), timing: str = "vidur"):
    """The timing backend the replay would build for ``model`` on ``hardware``."""
    cfg = compose([f"model={model}", f"hardware={hardware}", f"timing={timing}", *overrides])
    return instantiate(cfg.timing)


def batch(new_tokens, context) -> BatchShape:
    new_tokens = np.asarray(new_tokens, dtype=np.int64)
    return BatchShape(new_tokens=new_tokens,
                      context=np.broadcast_to(np.asarray(context, dtype=np.int64),
                                              new_tokens.shape).copy(),
                      is_prefill=new_tokens > 1)


def standard_shapes() -> dict[str, BatchShape]:
    shapes = {f"prefill 1x{n}": batch([n], 0) for n in (128, 256, 512, 1024, 2048, 4096)}
    shapes.update({f"prefill {k}x512": batch([512] * k, 0) for k in (2, 4, 8)})
    shapes.update({f"decode {b}@576": batch([1] * b, 576)
                   for b in (1, 2, 4, 8, 16, 32, 64, 128)})
    shapes.update({f"decode 1@{c}": batch([1], c) for c in (192, 1088, 4160)})
    return shapes


def shape_table(timing, model: str, hardware: str) -> pd.DataFrame:
    rows = []
    for name, shape in standard_shapes().items():
        before = sum(timing.out_of_range_batches.values())
        seconds = timing.duration(shape)
        rows.append({"model": model, "hardware": hardware, "shape": name,
                     "milliseconds": round(seconds * 1e3, 4),
                     "extrapolated": sum(timing.out_of_range_batches.values()) > before})
    return pd.DataFrame(rows)


def typical_iteration(experiment: str, overrides=()) -> tuple[BatchShape, dict]:
    """WAIT's full iteration for a typed experiment: ``n_j`` (fluid thresholds at the batch
    limit) requests at every stage ``0..o_j - 1`` of type ``j``; stage ``k`` holds ``s_j + k``
    slots before the iteration (stage 0: none, it prefills ``s_j`` tokens)."""
    from replay.fluid.model import TypeMix, wait_thresholds

    cfg = compose([f"experiment={experiment}", *overrides])
    if "types" not in cfg.workload:
        raise ConfigError(f"--experiment {experiment}: --explain needs an experiment with "
                          f"request types (workload.types), and {experiment} has none")
    mix = TypeMix.from_types(list(instantiate(cfg.workload).types))
    batch_limit = cfg.policy.get("batch_limit", cfg.get("batch_limit")) or 512
    n = wait_thresholds(mix, "fluid", batch_limit)
    prompts, decodes = [], []
    for s, o, count in zip(mix.prompt_len, mix.output_len, n, strict=True):
        prompts += [int(s)] * int(count)
        decodes += [int(s) + k for k in range(1, int(o)) for _ in range(int(count))]
    shape = BatchShape(new_tokens=np.array(prompts + [1] * len(decodes), dtype=np.int64),
                       context=np.array([0] * len(prompts) + decodes, dtype=np.int64),
                       is_prefill=np.arange(len(prompts) + len(decodes)) < len(prompts))
    return shape, {"experiment": experiment, "batch_limit": batch_limit,
                   "thresholds": n.tolist(), "prompts": len(prompts), "decodes": len(decodes),
                   "new_tokens": int(shape.new_tokens.sum()),
                   "mean_decode_context": float(np.mean(decodes)) if decodes else 0.0}


def vidur_decomposition(timing, shape: BatchShape) -> dict[str, float]:
    """``timing.duration(shape)`` in seconds by priced part; the token-wise operations split
    per Vidur operation with Vidur's own predictor."""
    parts = timing.parts(shape)
    predictor = timing.vidur_predictor()
    layers = timing.tables.num_layers
    tokens = -(-int(shape.new_tokens.sum()) // TOKEN_ROUNDING) * TOKEN_ROUNDING
    out = {}
    if tokens <= timing.tables.max_tokens:
        ops = list(TOKEN_OPS) + (["post_attention_layernorm"]
                                 if predictor._model_config.post_attn_norm else [])
        per_op = {op: predictor._predictions[op][(tokens,)] * layers * 1e-3 for op in ops}
        groups = {"MLP (up/gate and down projections, activation)":
                  ("mlp_up_proj", "mlp_down_proj", "mlp_act"),
                  "attention projections (QKV, output)": ("attn_pre_proj", "attn_post_proj"),
                  "norms, rope, residual add": ("input_layernorm", "post_attention_layernorm",
                                                "attn_rope", "add")}
        for name, members in groups.items():
            out[name] = float(sum(per_op.get(op, 0.0) for op in members))
        rest = parts["token_ops"] - sum(out.values())
        if predictor._replica_config.tensor_parallel_size > 1:
            out["all-reduce x 2 (tensor parallel)"] = float(rest)
    else:
        out["token-wise operations (beyond the profile: scaled)"] = parts["token_ops"]
    out["decode attention"] = parts["decode_attention"]
    out["prefill attention (per prompt)"] = parts["prefill_attention"]
    return out


def linear_decomposition(model: str, hardware: str, shape: BatchShape,
                         overrides=()) -> dict[str, float]:
    from replay.timing.simple import LinearTiming

    linear = compose_timing(model, hardware, [o for o in overrides if o.startswith("model.")],
                            timing="linear")
    kv, prefill, decodes, prompts = LinearTiming.terms(shape)
    return {"d0 (per iteration)": linear.d0, f"d1 x KV touched ({kv})": linear.d1 * kv,
            f"d2 x prefill tokens ({prefill})": linear.d2 * prefill,
            f"d3 x decode tokens ({decodes})": linear.d3 * decodes,
            f"d4 x prompts ({prompts})": linear.d4 * prompts}
