import subprocess
import sys

from cloudtrain import __version__


def test_version_prints_and_exits_zero():
    done = subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0
    assert done.stdout.strip() == f"cloudtrain {__version__}"
