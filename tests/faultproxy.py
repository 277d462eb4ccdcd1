#!/usr/bin/env python3
"""A TCP proxy that stands for the network between two hosts of a test:
latency, partitions and resets, on loopback, without root.

    proxy = FaultProxy("127.0.0.1", pg_port)   # listens on 127.0.0.1:<proxy.port>
    proxy.set_delay(2)                         # 2 ms each way, order kept
    proxy.partition()                          # both ways: nothing gets through
    proxy.partition(up=True, down=False)       # only client -> server is cut
    proxy.heal()                               # what was held goes through
    proxy.reset()                              # every open connection is reset
    proxy.turns                                # request/response turn-arounds

A partition holds bytes instead of forwarding them, as a DROP rule does to
TCP: the sender's data waits for a retransmission that gets through after the
heal (or its own timeout ends the connection first). New connections during
a partition are accepted but not connected onwards until the heal, as a SYN
that is dropped and retransmitted. `reset()` closes both sides at once with
an RST (SO_LINGER 0), as a REJECT with tcp-reset does.

`turns` counts how often the traffic of one connection changed direction
from client -> server to server -> client: with one request in flight at a
time, that is the number of round trips the client waited for.

It runs in its own thread (its own event loop), so a test drives it with
plain calls. As a program it runs until killed:

    python3 tests/faultproxy.py --listen 127.0.0.1:6543 --to 127.0.0.1:5432 --delay-ms 2
"""

import argparse
import asyncio
import socket
import struct
import threading
import time


class _Direction:
    """One direction of every connection: cut or not, and its delay."""

    def __init__(self):
        self.cut = False
        self.delay_s = 0.0


class FaultProxy:
    def __init__(self, target_host, target_port, listen_host="127.0.0.1", listen_port=0,
                 delay_ms=0):
        self.target = (target_host, target_port)
        self.host = listen_host
        self.up = _Direction()     # client -> server
        self.down = _Direction()   # server -> client
        self.up.delay_s = self.down.delay_s = delay_ms / 1000
        self.turns = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._healed = None          # asyncio.Event, set when nothing is cut
        self._open = set()           # writers of open connections (both sides)
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(listen_host, listen_port, ready),
                                        daemon=True, name=f"faultproxy->{target_port}")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("faultproxy did not start")

    # -- control (from any thread) ------------------------------------------
    def set_delay(self, ms_up, ms_down=None):
        self.up.delay_s = ms_up / 1000
        self.down.delay_s = (ms_up if ms_down is None else ms_down) / 1000

    def partition(self, up=True, down=True):
        """Cuts the link: `up` client -> server, `down` server -> client."""
        def cut():
            self.up.cut = self.up.cut or up
            self.down.cut = self.down.cut or down
            if self.up.cut or self.down.cut:
                self._healed.clear()
        self._call(cut)

    def heal(self):
        def heal():
            self.up.cut = self.down.cut = False
            self._healed.set()
        self._call(heal)

    def reset(self):
        """Resets every open connection (both sides)."""
        def reset():
            for w in list(self._open):
                _abort(w)
            self._open.clear()
        self._call(reset)

    def close(self):
        async def stop():
            self._server.close()
            for w in list(self._open):
                _abort(w)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()
        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop)
        except RuntimeError:
            pass
        self._thread.join(5)

    @property
    def port(self):
        return self._port

    @property
    def cut(self):
        return self.up.cut or self.down.cut

    # -- the proxy ------------------------------------------------------------
    def _call(self, fn):
        done = threading.Event()

        def run():
            try:
                fn()
            finally:
                done.set()
        self._loop.call_soon_threadsafe(run)
        if not done.wait(10):
            raise RuntimeError("faultproxy did not answer")

    def _run(self, host, port, ready):
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(_quiet_cancel)
        self._healed = asyncio.Event()
        self._healed.set()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, host, port))
        self._port = self._server.sockets[0].getsockname()[1]
        ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _serve(self, creader, cwriter):
        self.connections += 1
        self._open.add(cwriter)
        try:
            while self.cut:
                await self._healed.wait()
            try:
                sreader, swriter = await asyncio.open_connection(*self.target)
            except OSError:
                _abort(cwriter)
                return
            self._open.add(swriter)
            last = {"dir": None}
            await asyncio.gather(
                self._pump(creader, swriter, self.up, last, "up"),
                self._pump(sreader, cwriter, self.down, last, "down"),
                return_exceptions=True)
        finally:
            self._open.discard(cwriter)

    async def _pump(self, reader, writer, direction, last, name):
        """Forwards one direction, each chunk after its delay, in order,
        held while the direction is cut."""
        queue = asyncio.Queue()

        async def forward():
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                while direction.cut:
                    await self._healed.wait()
                writer.write(data)
                await writer.drain()
            try:
                writer.write_eof()
            except (OSError, RuntimeError):
                pass

        sender = asyncio.ensure_future(forward())
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if name == "up":
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
                    if last["dir"] == "up":
                        self.turns += 1
                last["dir"] = name
                await queue.put((time.monotonic() + direction.delay_s, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            queue.put_nowait((0, None))
            try:
                await sender
            except (OSError, ConnectionError):
                _abort(writer)


def via(url, proxy):
    """A postgres:// or http:// URL with its host and port those of `proxy`
    (user, path and query kept)."""
    from urllib.parse import urlsplit, urlunsplit
    u = urlsplit(url)
    auth = u.netloc.rsplit("@", 1)[0] + "@" if "@" in u.netloc else ""
    return urlunsplit((u.scheme, f"{auth}{proxy.host}:{proxy.port}", u.path, u.query, u.fragment))


def _quiet_cancel(loop, context):
    """The default handler, but for connections cancelled by `close()`
    (asyncio's stream callback then reports their CancelledError)."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


def _abort(writer):
    """Closes with an RST rather than a FIN."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="host:port to listen on")
    ap.add_argument("--to", required=True, help="host:port to forward to")
    ap.add_argument("--delay-ms", type=float, default=0)
    args = ap.parse_args()
    lh, lp = args.listen.rsplit(":", 1)
    th, tp = args.to.rsplit(":", 1)
    proxy = FaultProxy(th, int(tp), lh, int(lp), args.delay_ms)
    print(f"faultproxy {lh}:{proxy.port} -> {th}:{tp}, {args.delay_ms} ms each way", flush=True)
    try:
        while True:
            time.sleep(60)
    except KeyboardInterrupt:
        proxy.close()


if __name__ == "__main__":
    main()
