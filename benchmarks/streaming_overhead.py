"""Cost of streaming live metrics (Worker.log_event -> scheduler -> client) per iteration.

Runs the MNIST-1D CNN with the real ``train_rank`` on an embedded LocalCluster and
measures, on every rank:

* ``sink_ms/iter``: time spent inside the sink (``EventSink``: msgpack-able rows onto the
  worker's batched stream, plus the cancel check at most once per second), divided by
  the iterations: the direct overhead, compared with the mean iteration time;
* ``iter_ms stream / no-sink``: mean wall time per iteration of the same config with the
  sink attached and with ``sink=None`` (alternating repeats, medians), the end-to-end view.

Usage::

    .venv/bin/python benchmarks/streaming_overhead.py [--workers 2] [--iterations 300]
        [--sink-every 1,10] [--repeats 3]

The target is overhead < 2% of the iteration time at the default ``sink_every=10``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.lab import Lab


def timed_train(config, sink=None, device=None):  # runs on the Dask workers (pickled by value)
    """``train_rank`` with the sink wrapped in a timer (or removed when custom bench_stream is False)."""
    import time as _time

    from gtopk_lab.training.loop import train_rank

    spent = {"s": 0.0, "calls": 0}

    def timed(rows):
        t0 = _time.perf_counter()
        sink(rows)
        spent["s"] += _time.perf_counter() - t0
        spent["calls"] += 1

    stream = config.custom.get("bench_stream", True)
    result = train_rank(config, sink=timed if (stream and sink is not None) else None, device=device)
    result.summary["bench_sink_s"] = spent["s"]
    result.summary["bench_sink_calls"] = spent["calls"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--sink-every", default="1,10")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--method", default="gtopk")
    parser.add_argument("--out", default="results/bench-streaming")
    args = parser.parse_args()

    print(f"MNIST-1D CNN, {args.method}, P={args.workers}, {args.iterations} iterations, "
          f"{args.repeats} repeats (medians)")
    print(f"{'sink_every':>10} {'iter_ms stream':>15} {'iter_ms no-sink':>16} {'sink_ms/iter':>13} "
          f"{'sink/iter':>10} {'end-to-end':>11} {'events':>7}")
    with Lab(n_workers=args.workers, out=args.out, train_fn=timed_train, timeout_s=120) as lab:
        for sink_every in (int(s) for s in args.sink_every.split(",")):
            base = RunConfig(method=args.method, workers=args.workers, density=0.01, model="cnn",
                             dataset="mnist1d", epochs=100, max_iterations=args.iterations,
                             sink_every=sink_every, seed=1)
            lab.run(base.replace(max_iterations=20))  # warm-up: imports, dataset cache
            stream_ms, plain_ms, sink_ms, events = [], [], [], 0
            for _ in range(args.repeats):
                for stream in (True, False):
                    cfg = base.replace(custom={"bench_stream": stream})
                    handle = lab.submit(cfg)
                    metrics, summary = handle.result()
                    if summary["status"] != "completed":
                        raise RuntimeError(summary["error"])
                    it = metrics[metrics["kind"] == "iter"]
                    # wall time per iteration, from rank 0's cumulative clock
                    r0 = it[it["rank"] == 0]["wall_time_s"].to_numpy()
                    per_iter_ms = 1e3 * (r0[-1] - r0[0]) / max(1, len(r0) - 1)
                    if stream:
                        stream_ms.append(per_iter_ms)
                        sink_ms.append(1e3 * summary["bench_sink_s"] / summary["iterations"])
                        events = summary["bench_sink_calls"]
                    else:
                        plain_ms.append(per_iter_ms)
            s, p, k = statistics.median(stream_ms), statistics.median(plain_ms), statistics.median(sink_ms)
            print(f"{sink_every:>10} {s:>15.3f} {p:>16.3f} {k:>13.4f} {k / s:>10.2%} "
                  f"{(s - p) / p:>+11.2%} {events:>7}")
    time.sleep(0.1)


if __name__ == "__main__":
    main()
