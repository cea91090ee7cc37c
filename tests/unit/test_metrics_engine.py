"""Engine counters reach Prometheus: monotonic groups as counters, `*_now` groups as gauges."""

from voxgate.serving.metrics import Metrics


def test_engine_groups_render_as_counters_and_gauges():
    values = {"streams": {"admitted": 3.0}, "streams_now": {"running": 2.0, "waiting": 0.0}}
    metrics = Metrics()
    metrics.watch_engine(lambda: values)
    text = metrics.render().decode()
    assert 'voxgate_engine_streams_total{name="admitted"} 3.0' in text
    assert "# TYPE voxgate_engine_streams_now gauge" in text
    assert 'voxgate_engine_streams_now{name="running"} 2.0' in text
    values["streams_now"]["running"] = 1.0  # read at scrape time: a gauge goes down too
    assert 'voxgate_engine_streams_now{name="running"} 1.0' in metrics.render().decode()
