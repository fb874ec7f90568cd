"""A model's day in one command (``ctrkit refresh``): a new day's raw rows checked against the served model
(``checks``), scored by it before it trains on them, written ``--like`` it and trained on whole (``loop``), the
candidate proved against the served model on the same held-out rows (``gate``) and published as the next version of
a model repository, each day's verdict recorded with its figures (``store``, ``history_page``)."""
