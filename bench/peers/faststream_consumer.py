"""FastStream's side of bench/peers/faststream.sh: one subscriber on
`bench.peers` consumes N messages of 512 bytes, and the process prints

    scenario=faststream-<broker> msgs=<N> secs=<t> msgs_per_s=<r> cpu_s=<c> peak_rss_kib=<k>

with `secs` and `cpu_s` (process CPU time, all threads, getrusage) both
from the first message handled to the N-th, and the process's peak
resident set (VmHWM) when the N-th was handled, as ours reports them. The handler takes the body as
`bytes`, as ours takes `Bytes`. Per-message logging is off (`logger=None`),
as ours logs nothing per message; everything else is FastStream's default
(asyncio event loop, argument validation, its acknowledgement policy).

    python faststream_consumer.py nats-core|redis-streams|rabbitmq N
"""

import asyncio
import os
import resource
import sys
import time

SUBJECT = "bench.peers"
QUEUE = "bench@bench.peers"  # what the loader fills, ours reads
READ_COUNT = 100  # entries per XREADGROUP, as ours
PREFETCH = 256  # RabbitMQ prefetch, as ours
REPORT_EVERY = 1000  # NATS: "handled=<k>" lines, for the publisher's credit
TIMEOUT = 600.0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise SystemExit("no VmHWM in /proc/self/status")


def broker_and_subscriber(kind: str):
    """The broker and the subscriber decorator for one kind of broker."""
    if kind == "nats-core":
        from faststream.nats import NatsBroker

        url = os.environ.get("RUSTSTREAM_NATS_URL", "nats://127.0.0.1:4222")
        broker = NatsBroker(url, logger=None)
        return broker, broker.subscriber(SUBJECT)
    if kind == "redis-streams":
        from faststream.redis import RedisBroker, StreamSub

        url = os.environ.get("RUSTSTREAM_REDIS_URL", "redis://127.0.0.1:6379")
        broker = RedisBroker(url, logger=None)
        stream = StreamSub(SUBJECT, group="bench", consumer="faststream", max_records=READ_COUNT)
        return broker, broker.subscriber(stream=stream)
    if kind == "rabbitmq":
        from faststream.rabbit import Channel, RabbitBroker, RabbitQueue

        url = os.environ.get("RUSTSTREAM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
        broker = RabbitBroker(url, logger=None)
        queue = RabbitQueue(QUEUE, durable=True)
        return broker, broker.subscriber(queue, channel=Channel(prefetch_count=PREFETCH))
    raise SystemExit(f"unknown broker {kind!r}: nats-core, redis-streams or rabbitmq")


async def main(kind: str, n: int) -> None:
    broker, subscriber = broker_and_subscriber(kind)
    done = asyncio.Event()
    first: list[tuple[float, float]] = []
    seen = 0
    report = kind == "nats-core"

    @subscriber
    async def count(body: bytes) -> None:
        nonlocal seen
        if not first:
            first.append((time.perf_counter(), cpu_seconds()))
        seen += 1
        if report and seen % REPORT_EVERY == 0:
            print(f"handled={seen}", flush=True)
        if seen == n:
            done.set()

    await broker.start()
    print("ready", flush=True)
    try:
        await asyncio.wait_for(done.wait(), TIMEOUT)
    except asyncio.TimeoutError:
        raise SystemExit(f"faststream-{kind}: saw {seen} of {n} messages in {TIMEOUT:.0f} s")
    end = (time.perf_counter(), cpu_seconds())
    rss = peak_rss_kib()
    await broker.stop()
    secs = end[0] - first[0][0]
    cpu = end[1] - first[0][1]
    print(
        f"scenario=faststream-{kind} msgs={n} secs={secs:.6f} "
        f"msgs_per_s={n / secs:.0f} cpu_s={cpu:.3f} peak_rss_kib={rss}",
        flush=True,
    )


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[2].isdigit() or int(sys.argv[2]) < 1:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
