"""The pipeline end to end at small size, on the shared local[2] session: a live
service process produces while the streaming job counts and the consumer reads."""

from __future__ import annotations

from examples import pipeline


def test_pipeline_with_a_live_service(spark, tmp_path):
    summary = pipeline.run(str(tmp_path / "pipeline"), windows=3, rate=500, spark=spark)
    assert summary["service_alive"]
    assert summary["wrong"] == {}  # each window: 20 clicks per key, none counted twice
    starts = {start for _, start in summary["counts"]}
    assert len(starts) >= 3
    assert len(summary["counts"]) >= 3 * pipeline.KEYS
    assert summary["service"].startswith("service: produced")
    assert not spark.streams.active  # the query was stopped; the session lives on
