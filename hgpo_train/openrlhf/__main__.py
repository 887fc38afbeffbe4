"""``python -m hgpo_train.openrlhf``: ``python -m hgpo_train --backend openrlhf`` (same command line)."""

import sys

from hgpo_train.cli import main

if __name__ == "__main__":
    sys.exit(main(["--backend", "openrlhf", *sys.argv[1:]]))
