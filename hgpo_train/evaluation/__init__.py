"""Stage 5, evaluation: a policy on a fixed task panel (``python -m hgpo_train eval``) and the
table of methods over trained runs (``python -m hgpo_train compare``).

May import every stage below it; no backend.
"""
