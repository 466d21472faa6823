"""The word-count example: a JSONFileStore recorded into each shard's recovery log, with hot
standbys. ``gazette-consumer serve --app examples.word_count:WordCount``; see ``app.py``."""

from examples.word_count.app import Text, WordCount, counts_of

__all__ = ["Text", "WordCount", "counts_of"]
