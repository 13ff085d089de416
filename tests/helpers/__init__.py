"""What several test files share: paths here, process launches and models in the modules."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""
DEBUG_TOML = ROOT / "train_configs" / "debug.toml"
