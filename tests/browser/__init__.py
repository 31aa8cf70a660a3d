"""JupyterLab in a real browser (`make test-browser`); see conftest.py."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ARTIFACTS = REPO / "tests" / "artifacts"  # screenshots and the server log; ignored by git
