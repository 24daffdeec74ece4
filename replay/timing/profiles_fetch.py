"""Where Vidur's profile CSVs live locally, where they come from, and how to download them.

``python -m traces.fetch --data-dir DIR`` (the one download command for all data)
fetches, on a machine with internet access, the profiles the ``vidur`` timing
backend reads into
``DIR/vidur/profiling/`` (the layout of Vidur's own ``data/profiling/`` tree) from
the microsoft/vidur GitHub repository at pinned commits, checking each file's
SHA-256 against the copy the project was validated with (``traces.fetch`` does
the downloading).

* Linear-layer and network profiles come from ``raw.githubusercontent.com`` at
  the commits listed in ``PROFILE_FILES``.
* The Llama-2-70B attention profile is stored in Git LFS on Vidur's current
  branch; it comes from an older commit that kept it as a plain file
  (``data/profiling/a100/attention.csv`` at ``ATTENTION_70B_COMMIT``).
* The Llama-2-7B and Llama-3-8B attention profiles exist only in Git LFS
  (``lfs_url("attention", ...)``, content not validated by the project). Put one at
  its local path by hand to use it; otherwise the backend derives the table from
  the 70B profile (``replay/timing/attention_7b.py``).

Vidur 0.0.26 itself downloads profiles from HuggingFace datasets
(``model_profiling_dataset`` in its predictor config); the GitHub files are used
here because their content is pinned and known.
"""

from __future__ import annotations

from pathlib import Path

from replay.storage.data import RemoteFile, know

VIDUR_REPO = "microsoft/vidur"
ATTENTION_70B_COMMIT = "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a"
LFS_REF = "main"
LFS_HOST = "https://media.githubusercontent.com/media"
PROFILE_ROOT = "vidur/profiling"
COMPUTE_KINDS = ("mlp", "attention")
NETWORK_KINDS = ("all_reduce", "send_recv")


def relative_path(kind: str, model: str, device: str, network_device: str | None = None) -> str:
    """Path of a profile below ``profiling/`` (the same below Vidur's ``data/profiling/``)."""
    if kind in COMPUTE_KINDS:
        return f"compute/{device}/{model}/{kind}.csv"
    if kind in NETWORK_KINDS:
        if not network_device:
            raise ValueError(f"profile {kind!r} needs a network device")
        return f"network/{network_device}/{kind}.csv"
    raise ValueError(f"unknown profile kind {kind!r}; expected one of "
                     f"{COMPUTE_KINDS + NETWORK_KINDS}")


def _vidur_file(relative: str, commit: str, sha256: str, size: int,
                repo_path: str | None = None) -> RemoteFile:
    return RemoteFile(f"{PROFILE_ROOT}/{relative}", VIDUR_REPO, commit,
                      repo_path or f"data/profiling/{relative}", sha256, size)


# Each commit holds a file of the validated size (microsoft/vidur, checked offline); the
# SHA-256 check at download decides.
PROFILE_FILES: tuple[RemoteFile, ...] = (
    _vidur_file("compute/a100/meta-llama/Llama-2-70b-hf/attention.csv", ATTENTION_70B_COMMIT,
                "83f4bb3ac779878b98457d1e596b324206c6c39d8bf4b25f35a1f14ccbd8af24", 3_021_220,
                "data/profiling/a100/attention.csv"),
    _vidur_file("compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv",
                "25e529deb1f90ffa53d6777622b8e2a1ef78a0f0",
                "d690ce601f94ab80586e1d5a6a92ea0d64114dc3e0895bf32b3bee270f3d9b7f", 688_286),
    _vidur_file("compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
                "bee57dafa1eb2dc422dcaec46a66975599a6a242",
                "2cfacca979f32e83257753cf6fd815a71af8ba9a7a9d0643b18d9f54e8a37688", 706_614),
    # The profile the WAIT authors' fork ran with (git blob 36db734 there too).
    _vidur_file("compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
                "41ab8ab15cd6217284b025750fc6b81364d359e6",
                "98c26488298e324e89db7349e213f75c856ae83dc6b17548a68636d2cb5efff0", 1_204_856),
    _vidur_file("network/a100_pairwise_nvlink/all_reduce.csv",
                "5555bb810209639fed7a774a0b40b77cfca5ee33",
                "27428d884ae095800e81366c7517af93fd7476633cfe5e55bdd155e004485dab", 420_449),
    _vidur_file("network/a100_pairwise_nvlink/send_recv.csv",
                "60277c06b41e49483609bdab55f71fe0fb5fdd54",
                "b962137cf047ab0bb80d11f45ea2a008b9684d0749805995b44b112ae302fff4", 180_604),
    _vidur_file("network/a100_dgx/all_reduce.csv",
                "e26eb8f79fa9a6a7c38eac0f5291302402b20364",
                "5ea3f3c229fee1ef70ea308881fff420d60ab6f30e86edda1ed6146b12eb28ef", 645_190),
    _vidur_file("network/a100_dgx/send_recv.csv",
                "d2005126ef07d1b8421f4e1631757e34e69fe6fb",
                "7e5968cf616af8208a1420816c4ffba9ee857cd989148ae54ebf46239e477a72", 176_791),
)
_BY_PATH = {remote.relpath: remote for remote in PROFILE_FILES}
# require_file then refuses a copy of one of these (below any profile_dir) whose bytes differ.
know(PROFILE_FILES, PROFILE_ROOT)


def profile_paths(profile_dir: Path, model: str, device: str,
                  network_device: str | None = None) -> dict[str, Path]:
    kinds = COMPUTE_KINDS + (NETWORK_KINDS if network_device else ())
    return {kind: Path(profile_dir) / relative_path(kind, model, device, network_device)
            for kind in kinds}


def lfs_url(kind: str, model: str, device: str, network_device: str | None = None) -> str:
    """GitHub's Git LFS download URL of a profile on Vidur's main branch."""
    return (f"{LFS_HOST}/{VIDUR_REPO}/{LFS_REF}/data/profiling/"
            f"{relative_path(kind, model, device, network_device)}")


def source_url(kind: str, model: str, device: str, network_device: str | None = None) -> str:
    """Where a profile comes from: its pinned download, else its Git LFS URL."""
    relative = f"{PROFILE_ROOT}/{relative_path(kind, model, device, network_device)}"
    remote = _BY_PATH.get(relative)
    return remote.url if remote else lfs_url(kind, model, device, network_device)


def fetch_hint(kind: str, model: str, device: str, network_device: str | None = None) -> str:
    """The ``what`` of a missing-file error: which profile, its origin, the download command."""
    known = f"{PROFILE_ROOT}/{relative_path(kind, model, device, network_device)}" in _BY_PATH
    return (f"Vidur {kind} profile for {model} on {device}"
            + (f" / {network_device}" if kind in NETWORK_KINDS else "")
            + f" (origin: {source_url(kind, model, device, network_device)}"
            + ("; download with `python -m traces.fetch --data-dir DATA_DIR`)"
               if known else "; Git LFS, download by hand)"))

