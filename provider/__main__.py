"""The k3infra Pulumi plugin: serves K3ServingStack to programs in any language.

Runs the k3infra sources beside this folder (a source-based package), not whatever
k3infra the virtualenv may have installed.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from k3infra.plugin.host import main  # noqa: E402

if __name__ == "__main__":
    main()
