"""A Spark pipeline over Gazette journals: ``python -m examples.spark_pipeline.pipeline --demo``.
See ``pipeline.py`` and README.md."""
