"""Moved: ``python -m hgpo_train --backend openrlhf`` (same command line). This old path goes after release 0.1."""

raise SystemExit(
    "python -m hgpo_train.openrlhf is now python -m hgpo_train --backend openrlhf (same command line)"
)
