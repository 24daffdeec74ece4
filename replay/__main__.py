"""``python -m replay [overrides]``: one replay (or a Hydra multirun sweep with ``-m``).

The last line printed is the run summary as one JSON object.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from replay.run import run

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> dict:
    summary = run(cfg, Path(HydraConfig.get().runtime.output_dir))
    print(json.dumps(summary, default=str), flush=True)
    return summary


if __name__ == "__main__":
    main()
