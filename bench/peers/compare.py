"""Driver of bench/peers/faststream.sh (see its header for what each side
does): interleaved rounds of ours and FastStream's consumer per broker,
then the median msgs/s, CPU seconds and peak RSS of each and the ratios.

    compare.py BENCH_BINARY

Environment: N (default 100000), ROUNDS (default 3), BROKERS (default
"nats-core redis-streams rabbitmq"), and the brokers' URLs as the bench
reads them.
"""

import asyncio
import os
import statistics
import subprocess
import sys
import threading
import uuid

import redis
from faststream.redis.parser import BinaryMessageFormatV1

HERE = os.path.dirname(os.path.abspath(__file__))
SUBJECT = "bench.peers"
PAYLOAD = b"x" * 512
REDIS_URL = os.environ.get("RUSTSTREAM_REDIS_URL", "redis://127.0.0.1:6379")


def fail(message: str) -> None:
    raise SystemExit(f"faststream.sh: {message}")


def fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


async def envelopes(count: int) -> list[bytes]:
    """FastStream's envelopes of the payload, each with its own correlation
    id, encoded as its publisher encodes them."""
    return [
        await BinaryMessageFormatV1.encode(
            message=PAYLOAD, reply_to=None, headers=None, correlation_id=str(uuid.uuid4())
        )
        for _ in range(count)
    ]


def load_redis(n: int, faststream: bool) -> None:
    """A fresh stream of n entries and group `bench` at its start, each
    entry as the side's own publisher writes it: ours a `p` field holding
    the payload, FastStream a `__data__` field holding its binary envelope
    (its one header: a fresh correlation id)."""
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(SUBJECT)
    for start in range(0, n, 1000):
        count = min(n, start + 1000) - start
        if faststream:
            entries = [{"__data__": e} for e in asyncio.run(envelopes(count))]
        else:
            entries = [{"p": PAYLOAD}] * count
        pipe = client.pipeline(transaction=False)
        for entry in entries:
            pipe.xadd(SUBJECT, entry)
        pipe.execute()
    client.xgroup_create(SUBJECT, "bench", id="0")
    client.close()


def consume(command: list[str], feed: list[str] | None) -> dict[str, float]:
    """Runs one consumer process (after `ready`, the `feed` process when
    there is one) and returns its msgs/s, CPU seconds and peak RSS."""
    consumer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert consumer.stdout is not None
    out = []
    if feed is not None:
        line = consumer.stdout.readline()
        if line.strip() != "ready":
            fail(f"{command} did not get ready (said {line!r})")
        # The consumer's "handled=<k>" reports go to the publisher, whose
        # credit they are.
        feeder = subprocess.Popen(feed, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        assert feeder.stdin is not None

        def stop_consumer_if_feeder_fails() -> None:
            if feeder.wait() != 0:
                consumer.kill()

        threading.Thread(target=stop_consumer_if_feeder_fails, daemon=True).start()
        for line in consumer.stdout:
            if not line.startswith("handled="):
                out.append(line)
            elif feeder.poll() is None:
                try:
                    feeder.stdin.write(line)
                    feeder.stdin.flush()
                except BrokenPipeError:
                    pass  # it has published all
        try:
            feeder.stdin.close()
        except BrokenPipeError:
            pass
        if feeder.wait() != 0:
            fail(f"{feed} exited {feeder.returncode}")
    out += consumer.stdout.readlines()
    consumer.stdout.close()
    consumer.wait()
    out = "".join(out)
    result = [fields(line) for line in out.splitlines() if line.startswith("scenario=")]
    if consumer.returncode != 0 or not result:
        fail(f"{command} exited {consumer.returncode}: {out!r}")
    return {
        "msgs_per_s": float(result[-1]["msgs_per_s"]),
        "cpu_s": float(result[-1]["cpu_s"]),
        # Not wait4's ru_maxrss: across fork and exec it keeps this
        # driver's own peak.
        "rss_mib": float(result[-1]["peak_rss_kib"]) / 1024,
    }


def main() -> None:
    bench = sys.argv[1]
    n = int(os.environ.get("N", "100000"))
    rounds = int(os.environ.get("ROUNDS", "3"))
    brokers = os.environ.get("BROKERS", "nats-core redis-streams rabbitmq").split()
    python = sys.executable
    theirs_script = os.path.join(HERE, "faststream_consumer.py")
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(1, rounds + 1):
        for broker in brokers:
            for side in ("ruststream", "faststream"):
                if side == "ruststream":
                    command = [bench, f"peer-{broker}", str(n)]
                else:
                    command = [python, theirs_script, broker, str(n)]
                feed = None
                if broker == "nats-core":
                    feed = [bench, "peer-publish-nats", str(n)]
                elif broker == "redis-streams":
                    load_redis(n, faststream=side == "faststream")
                elif broker == "rabbitmq":
                    subprocess.run(
                        [bench, "peer-load-rabbitmq", str(n)], check=True, stdout=subprocess.DEVNULL
                    )
                else:
                    fail(f"unknown broker {broker!r}")
                r = consume(command, feed)
                results.setdefault((broker, side), []).append(r)
                print(
                    f"round {round_} {broker:<14} {side:<10} {r['msgs_per_s']:>10.0f} msgs/s "
                    f"{r['cpu_s']:>7.3f} CPU s {r['rss_mib']:>6.1f} MiB",
                    file=sys.stderr,
                    flush=True,
                )

    print(f"N = {n} x 512 B, medians of {rounds} interleaved rounds")
    print(f"{'broker':<14} {'consumer':<18} {'msgs/s':>10} {'CPU s':>8} {'peak RSS MiB':>13}")
    for broker in brokers:
        med = {
            side: {k: statistics.median(r[k] for r in results[broker, side]) for k in results[broker, side][0]}
            for side in ("ruststream", "faststream")
        }
        ours, theirs = med["ruststream"], med["faststream"]
        for side, m in (("ruststream", ours), ("faststream", theirs)):
            print(f"{broker:<14} {side:<18} {m['msgs_per_s']:>10.0f} {m['cpu_s']:>8.3f} {m['rss_mib']:>13.1f}")
        print(
            f"{broker:<14} {'ruststream ahead':<18} "
            f"{ours['msgs_per_s'] / theirs['msgs_per_s']:>9.1f}x "
            f"{theirs['cpu_s'] / ours['cpu_s']:>7.1f}x {theirs['rss_mib'] / ours['rss_mib']:>12.1f}x"
        )


if __name__ == "__main__":
    main()
