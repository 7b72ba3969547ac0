"""Place reservations on a labgrid coordinator, so CI runners on many hosts share one lab.

With ``EDGEKIT_COORDINATOR=host:port`` set, every DeviceSession on an inventory device acquires the
labgrid place named after the device before it measures (``session_place``, called from
devices/session.py after the host lock and before the device-side lease) and releases it when the
session closes, on success and on error alike. Waiting follows the host lock's options
(``--no-wait``, ``--lock-timeout``); a refusal names the holder (exit 3). An unreachable coordinator
is an error naming the address (exit 3), never a silent run without reservations.

edgekit talks to the coordinator through labgrid's own Python client (``ClientSession``: its gRPC
stream, its mirror of the places, its stub), one session per connection on the process's one event loop
thread (so any thread, e.g. a fleet's units, can call it).

**Who holds a place.** labgrid records the client's name (``HOST/USER``) as the holder. edgekit's
name is ``HOST:edgekit-RUN:pidPID:ttlTTL:HOSTID/USER``: unique per process (two runners on one
machine differ), readable in ``labgrid-client who``, and parsed back by the next acquirer.

**A holder that crashed.** labgrid places never expire: the coordinator keeps a place acquired after
its client disconnects (SIGKILL, power loss). So while edgekit holds a place it renews it every TTL/3
seconds through labgrid's ``AllowPlace`` (only the holder may call it, and it moves the place's
``changed`` stamp). A waiting edgekit takes a place over, with labgrid's atomic
``ReleasePlace(fromuser=HOLDER)`` (what ``labgrid-client release-from`` does, so it can never free a
newer holder's place), when

- the holder ran on this host (same host id: hostname, boot id and PID namespace) and its process is
  gone: at once, ``--no-wait`` included;
- or the place's ``changed`` stamp has not moved for the holder's TTL, timed on the waiter's own
  monotonic clock (a holder on another host that died or lost its link; no two hosts' clocks are
  ever compared).

A place held by anything but edgekit (a person's ``labgrid-client acquire``) is never taken over: the
refusal names it and the hint says how to free it (``labgrid-client ... release --kick``). A labgrid
reservation (``labgrid-client reserve``) allocated to someone else is waited for like a holder.

The coordinator forgets every acquisition when it restarts; the renewing task then acquires the place
again (or, if another host got it first, the session's report says the place was lost).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import getpass
import hashlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from ..errors import BadInputError, DeviceError, require
from ..sim.procs import alive  # a zombie counts as gone
from .lock import DeviceLockedError

ENV = "EDGEKIT_COORDINATOR"
TTL_ENV = "EDGEKIT_PLACE_TTL_S"
DEFAULT_PORT = 20408  # labgrid's default
DEFAULT_TTL_S = 60.0  # a crashed holder on another host frees its place this long after its last renewal
CONNECT_TIMEOUT_S = 10.0
RPC_TIMEOUT_S = 30.0
POLL_S = 0.3
RUN_ID = os.environ.get("EDGEKIT_RUN_ID") or os.urandom(6).hex()  # one per process unless CI sets it

log = logging.getLogger("edgekit.lab")
T = TypeVar("T")

_HELD: set[tuple[str, str]] = set()  # (address, place) held by a live reservation of this process
_HELD_LOCK = threading.Lock()
_LOOP: asyncio.AbstractEventLoop | None = None  # one event loop thread per process, started on first use
_LOOP_LOCK = threading.Lock()

_HOLDER_RE = re.compile(r"^(?P<host>[^:/]+):edgekit-(?P<run>[^:/]+):pid(?P<pid>\d+):ttl(?P<ttl>[0-9.]+):"
                        r"(?P<hid>[0-9a-f]{8})/(?P<user>[^/]*)$")


# --- errors --------------------------------------------------------------------------------------
class CoordinatorUnreachable(DeviceError):
    """No labgrid coordinator answered at the address (exit 3)."""

    def __init__(self, address: Address, why: str):
        super().__init__(f"the labgrid coordinator at {address} is unreachable: {why}",
                         hint=f"start it there (`labgrid-coordinator --listen {address}`) or fix the address "
                              f"({ENV} / --coordinator); unset {ENV} to measure without labgrid reservations "
                              "(the device-side lease still guards each device)")
        self.address = str(address)


class CoordinatorRefused(DeviceError):
    """The coordinator answered a request with an error (its gRPC status and details)."""

    def __init__(self, address: Address, method: str, code: str, details: str):
        super().__init__(f"the labgrid coordinator at {address} refused {method}: {details} ({code})")
        self.code, self.details = code, details


class PlaceHeld(DeviceLockedError):
    """Another holder has the device's place on the coordinator (exit 3)."""


# --- addresses and names -------------------------------------------------------------------------
@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(value: str, source: str = ENV) -> Address:
    """``host:port`` (port 20408 when left out) from ``source`` (the variable or option it came from)."""
    v = (value or "").strip()
    bad = BadInputError(f"{source}={value!r} is not a coordinator address HOST:PORT",
                        hint=f"e.g. {ENV}=lab-server:{DEFAULT_PORT} (labgrid's coordinator port)")
    if not v or "/" in v or " " in v:
        raise bad
    try:
        u = urlsplit("//" + v)
        host, port = u.hostname, u.port
    except ValueError:
        raise bad from None
    if not host:
        raise bad
    return Address(host, port or DEFAULT_PORT)


def address_from_env() -> Address | None:
    v = os.environ.get(ENV, "").strip()
    return parse_address(v) if v else None


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): the uid says enough
        return str(os.getuid())


@functools.lru_cache(maxsize=1)
def host_id() -> str:
    """This host as far as PIDs go: hostname, boot id and PID namespace (two containers sharing a
    hostname differ; two network namespaces of one machine do not, and their PIDs are one space)."""
    parts = [socket.gethostname()]
    try:
        parts.append(open("/proc/sys/kernel/random/boot_id").read().strip())
    except OSError:
        pass
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:8]


def holder_name(ttl_s: float = DEFAULT_TTL_S) -> str:
    """The name this process gives the coordinator (recorded as the holder of what it acquires)."""
    return (f"{socket.gethostname()}:edgekit-{RUN_ID}:pid{os.getpid()}:ttl{ttl_s:g}:{host_id()}/"
            f"{_user().replace('/', '_')}")


@dataclass(frozen=True)
class Holder:
    host: str
    run: str
    pid: int
    ttl_s: float
    host_id: str
    user: str


def parse_holder(acquired: str | None) -> Holder | None:
    """An edgekit holder's name taken apart; None for anything else (labgrid-client users)."""
    m = _HOLDER_RE.match(acquired or "")
    if not m:
        return None
    return Holder(m["host"], m["run"], int(m["pid"]), float(m["ttl"]), m["hid"], m["user"])


def describe_holder(acquired: str | None, changed: float | None = None) -> str:
    if not acquired:
        return "nobody"
    h = parse_holder(acquired)
    if h is not None:
        who = f"edgekit run {h.run} (PID {h.pid} on {h.host}, user {h.user})"
    else:
        host, _, user = acquired.partition("/")
        who = f"{user or '?'} on {host} (labgrid-client, not edgekit)"
    if changed:
        who += f", place last touched {time.strftime('%H:%M:%S', time.localtime(changed))} (coordinator's clock)"
    return who


# --- the client ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlaceView:
    """A place as the coordinator last described it (a copy: safe to read from any thread)."""

    name: str
    acquired: str | None
    changed: float
    tags: dict[str, str]
    matches: tuple[str, ...]
    comment: str
    acquired_resources: tuple[str, ...]
    reservation: str | None


@dataclass(frozen=True)
class ResourceView:
    path: str  # exporter/group/cls/name
    cls: str
    params: dict[str, object]
    acquired: str | None
    avail: bool


class LabgridSession(Protocol):
    """What edgekit uses of labgrid's ClientSession (labgrid ships no type information: its place,
    resource and gRPC objects stay untyped)."""

    holder: str
    stopping: asyncio.Event
    stub: Any  # labgrid's generated gRPC stub; its methods are looked up by name
    places: dict[str, Any]  # place name -> labgrid's Place
    resources: dict[str, dict[str, dict[str, Any]]]  # exporter -> group -> name -> labgrid's resource entry

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def close(self) -> None: ...
    async def sync_with_coordinator(self) -> bool: ...


def _labgrid_client() -> ModuleType:
    return require("labgrid.remote.client", "lab", f"{ENV} and `edgekit lab` (labgrid place reservations)")


@functools.lru_cache(maxsize=1)
def _session_class() -> Callable[..., LabgridSession]:
    _labgrid_client()  # labgrid missing: the install hint
    from labgrid.remote.client import ClientSession

    # labgrid ships no type information: its ClientSession is untyped (Any), which strict mypy refuses as a base
    class EdgekitClientSession(ClientSession):  # type: ignore[misc]
        """labgrid's client session, named after the edgekit holder instead of LG_HOSTNAME/LG_USERNAME."""

        holder = "?/?"
        channel: Any  # a grpc.aio channel (grpc ships no type information)

        def __attrs_post_init__(self) -> None:
            import grpc
            from labgrid.remote.generated import labgrid_coordinator_pb2_grpc

            super().__attrs_post_init__()
            # The coordinator keys clients by their connection (peer address); gRPC shares one connection
            # among a process's channels to one target, so a fleet's sessions would look like one client
            # (the coordinator refuses that). A channel of its own per session: labgrid's keepalive
            # options plus a local subchannel pool. labgrid's channel is unused so far (channels connect
            # lazily) and is closed at once.
            unused = self.channel
            self.channel = grpc.aio.insecure_channel(target=self.address, options=[
                ("grpc.keepalive_time_ms", 7500), ("grpc.keepalive_timeout_ms", 10000),
                ("grpc.http2.ping_timeout_ms", 10000), ("grpc.http2.max_pings_without_data", 0),
                ("grpc.use_local_subchannel_pool", 1)])
            self.stub = labgrid_coordinator_pb2_grpc.CoordinatorStub(self.channel)
            self._unused_closing = self.loop.create_task(unused.close())

        def gethostname(self) -> str:
            return self.holder.split("/", 1)[0]

        def getuser(self) -> str:
            return self.holder.split("/", 1)[1]

    return EdgekitClientSession


def _probe(address: Address, timeout: float) -> None:
    """A plain TCP connect first: an unreachable address fails here, fast and in words, before gRPC
    (which would retry quietly and log its own messages)."""
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout):
            pass
    except OSError as exc:
        raise CoordinatorUnreachable(address, f"TCP connect failed ({exc.strerror or exc})") from exc


def _shared_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for labgrid's client, in a daemon thread. One loop for every connection
    (grpc.aio is happiest that way) and never closed: closing a loop while gRPC's poller may still post
    to it prints "Event loop is closed" from gRPC's thread."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="edgekit-labgrid", daemon=True).start()
            _LOOP = loop
        return _LOOP


async def _shutdown(session: LabgridSession) -> None:
    with contextlib.suppress(Exception):
        await session.stop()
    with contextlib.suppress(Exception):
        await session.close()


class Coordinator:
    """One connection to a labgrid coordinator under one holder name: labgrid's ClientSession with a
    gRPC channel of its own, run on the process's labgrid event loop; usable from any thread."""

    def __init__(self, address: Address, *, holder: str | None = None, timeout: float = CONNECT_TIMEOUT_S):
        self.address = address
        self.holder = holder or holder_name()
        self.timeout = timeout
        self.session: LabgridSession | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> "Coordinator":
        return self.connect()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def connect(self) -> "Coordinator":
        _labgrid_client()
        _probe(self.address, self.timeout)
        self.loop = _shared_loop()
        try:
            self.session = self.run(self._open(), self.timeout + 5)
        except BaseException:
            self.close()
            raise
        return self

    async def _open(self) -> LabgridSession:
        from labgrid.remote.client import ServerError

        s = _session_class()(address=str(self.address), loop=self.loop)
        s.holder = self.holder
        try:
            await asyncio.wait_for(s.start(), self.timeout)
        except (ServerError, asyncio.TimeoutError, OSError) as exc:
            await _shutdown(s)
            raise CoordinatorUnreachable(self.address, "it accepts TCP connections but no labgrid coordinator "
                                         f"answered within {self.timeout:.0f} s ({type(exc).__name__})") from exc
        return s

    async def _ensure(self) -> LabgridSession:
        """The live session (a new one when the stream broke: the coordinator restarted)."""
        if self.session is None or self.session.stopping.is_set():
            old, self.session = self.session, None
            if old is not None:
                await _shutdown(old)
            self.session = await self._open()
        return self.session

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = RPC_TIMEOUT_S + 5) -> T:
        """Run ``coro`` on the connection's loop and wait for its result."""
        if self.loop is None:
            coro.close()
            raise RuntimeError(f"the coordinator connection to {self.address} is not open (connect() first)")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise CoordinatorUnreachable(self.address, f"no answer within {timeout:.0f} s") from None

    async def rpc_async(self, method: str, **fields: object) -> object:
        import grpc
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb

        s = await self._ensure()
        request = getattr(pb, f"{method}Request")(**fields)
        try:
            response = await getattr(s.stub, method)(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise CoordinatorUnreachable(self.address, f"{method}: {exc.details()}") from exc
            raise CoordinatorRefused(self.address, method, exc.code().name, exc.details() or "") from exc
        await s.sync_with_coordinator()  # the place updates this request caused have arrived
        return response

    def rpc(self, method: str, **fields: object) -> object:
        return self.run(self.rpc_async(method, **fields))

    async def places_async(self) -> dict[str, PlaceView]:
        s = await self._ensure()
        if not await s.sync_with_coordinator():
            raise CoordinatorUnreachable(self.address, "the connection dropped")
        out: dict[str, PlaceView] = {}
        for name, p in s.places.items():
            out[name] = PlaceView(name=name, acquired=p.acquired or None, changed=float(p.changed or 0.0),
                                  tags=dict(p.tags), matches=tuple(repr(m) for m in p.matches),
                                  comment=p.comment or "",
                                  acquired_resources=tuple("/".join(r) for r in p.acquired_resources),
                                  reservation=p.reservation)
        return out

    def places(self) -> dict[str, PlaceView]:
        return self.run(self.places_async())

    async def _resources(self) -> list[ResourceView]:
        s = await self._ensure()
        await s.sync_with_coordinator()
        out: list[ResourceView] = []
        for exporter, groups in s.resources.items():
            for group, res in groups.items():
                for name, r in res.items():
                    if not r.data:  # deleted
                        continue
                    params = {k: v for k, v in (r.params or {}).items() if k != "extra"}
                    out.append(ResourceView(f"{exporter}/{group}/{r.cls}/{name}", r.cls, params, r.acquired,
                                            bool(r.avail)))
        return sorted(out, key=lambda r: r.path)

    def resources(self) -> list[ResourceView]:
        return self.run(self._resources())

    def close(self) -> None:
        """End this connection's session (the shared loop stays for the next one)."""
        loop, self.loop = self.loop, None
        s, self.session = self.session, None
        if loop is not None and s is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_shutdown(s), loop).result(10)


# --- a session's place ---------------------------------------------------------------------------
@dataclass
class PlaceReservation:
    """The labgrid place of one DeviceSession: acquired (waiting as told), renewed while held,
    released (only if still ours) at the end."""

    device: str
    address: Address
    ttl_s: float = DEFAULT_TTL_S
    say: Callable[[str], None] | None = None
    client: Coordinator | None = None
    took_over: str | None = None  # whose stale place this one was, and why it counted as stale
    lost: str | None = None  # why the place stopped being ours while held, else None
    waited_s: float = 0.0
    last_error: str | None = None  # the last renewal that failed (retried on the next round)
    _task: asyncio.Task[None] | None = None
    _stale_seen: tuple[tuple[str | None, float], float] | None = None  # ((holder, changed), first seen)

    @property
    def key(self) -> tuple[str, str]:
        return (str(self.address), self.device)

    def _connected(self) -> Coordinator:
        """The coordinator connection ``acquire`` opened."""
        if self.client is None:
            raise RuntimeError(f"the labgrid place of '{self.device}' is not reserved (acquire() first)")
        return self.client

    def acquire(self, *, wait: bool = True, timeout: float | None = None) -> "PlaceReservation":
        self.client = Coordinator(self.address, holder=holder_name(self.ttl_s)).connect()
        try:
            self._acquire(wait, timeout)
            with _HELD_LOCK:
                _HELD.add(self.key)
            self.client.run(self._start_renewing())
        except BaseException:
            with _HELD_LOCK:
                _HELD.discard(self.key)
            self.client.close()
            self.client = None
            raise
        return self

    def _acquire(self, wait: bool, timeout: float | None) -> None:
        c, name = self._connected(), self.device
        start = time.monotonic()
        while True:
            place = c.places().get(name)
            if place is None:
                raise DeviceError(f"device '{name}' has no place on the labgrid coordinator at {self.address} "
                                  f"({ENV} is set, so every deploy reserves its devices there)",
                                  hint=f"create it: `edgekit lab export --coordinator {self.address} {name}` "
                                       "(hosts sharing a device must give it the same inventory name)")
            refused = None
            if place.acquired is None:
                try:
                    c.rpc("AcquirePlace", placename=name)
                    break
                except CoordinatorRefused as exc:  # another host was faster, or a reservation/resource blocks it
                    refused = exc.details
                place = c.places().get(name) or place
            stale = self._stale(place) if place.acquired else None
            if stale:
                # atomic: frees the place only if that holder still has it (never a newer holder's)
                c.rpc("ReleasePlace", placename=name, fromuser=place.acquired)
                self.took_over = f"{describe_holder(place.acquired)}: {stale}"
                if self.say:
                    self.say(f"took over the labgrid place '{name}' of {self.took_over}")
                else:
                    log.warning("device %s: took over the labgrid place of %s", name, self.took_over)
                continue
            if not wait or (timeout is not None and time.monotonic() - start >= timeout):
                raise self._refusal(place, refused, None if not wait else timeout)
            time.sleep(POLL_S)
        self.waited_s = time.monotonic() - start
        if self.say:
            self.say(f"reserved labgrid place '{name}' on {self.address}"
                     + (f" (waited {self.waited_s:.1f} s)" if self.waited_s >= 1 else ""))

    def _stale(self, place: PlaceView) -> str | None:
        """Why the place's holder counts as gone, or None (an edgekit holder only)."""
        h = parse_holder(place.acquired)
        if h is None:
            return None
        if place.acquired == self._connected().holder:
            with _HELD_LOCK:
                live = self.key in _HELD
            return None if live else "left acquired by this process (a release that never reached the coordinator)"
        if h.host_id == host_id() and not alive(h.pid):
            return f"its process (PID {h.pid} on this host) is gone"
        seen = (place.acquired, place.changed)
        now = time.monotonic()
        if self._stale_seen is None or self._stale_seen[0] != seen:
            self._stale_seen = (seen, now)
            return None
        quiet = now - self._stale_seen[1]
        if quiet >= max(h.ttl_s, 0.5):
            return f"not renewed for {quiet:.1f} s (it renews every {h.ttl_s / 3:.1f} s; TTL {h.ttl_s:g} s)"
        return None

    def _refusal(self, place: PlaceView, refused: str | None, waited: float | None) -> PlaceHeld:
        name, addr = self.device, self.address
        if place.acquired is None:
            what = f"the coordinator refused to acquire it: {refused or 'no reason given'}"
            if place.reservation:
                what += f" (it is allocated to labgrid reservation {place.reservation})"
        else:
            what = f"held by {describe_holder(place.acquired, place.changed)}"
        h = parse_holder(place.acquired)
        if place.acquired and h is None:
            hint = (f"it was acquired outside edgekit and is never taken over automatically; when it is not in use, "
                    f"free it with `labgrid-client -x {addr} -p {name} release --kick`")
        elif waited is None:
            hint = "wait for that run (drop --no-wait to queue behind it)"
        else:
            hint = ("raise --lock-timeout, or stop the other run" + (
                f"; a holder that died elsewhere loses the place {h.ttl_s:g} s after its last renewal"
                if h is not None and waited < h.ttl_s else ""))
        if waited is None:
            return PlaceHeld(f"device '{name}' is reserved on the labgrid coordinator {addr} (place '{name}'): {what}",
                             hint=hint)
        return PlaceHeld(f"device '{name}' stayed reserved on the labgrid coordinator {addr} for {waited:.0f} s "
                         f"(place '{name}'): {what}", hint=hint)

    async def _start_renewing(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renew(), name=f"renew place {self.device}")

    async def _renew(self) -> None:
        c, name = self._connected(), self.device
        every = max(0.2, self.ttl_s / 3.0)
        while True:
            await asyncio.sleep(every)
            try:
                await c.rpc_async("AllowPlace", placename=name, user=c.holder)  # holder-only; touches the place
                self.last_error = None
                continue
            except CoordinatorRefused:
                pass
            except (DeviceError, OSError) as exc:  # unreachable for now: the next round reconnects
                self.last_error = str(exc)
                continue
            try:  # refused: not ours any more. A restarted coordinator forgot it: take it again if free.
                place = (await c.places_async()).get(name)
                if place is not None and place.acquired is None:
                    await c.rpc_async("AcquirePlace", placename=name)
                    log.warning("device %s: acquired the labgrid place again (the coordinator had forgotten it)",
                                name)
                    continue
            except (DeviceError, OSError) as exc:
                self.last_error = str(exc)
                place = None
            holder = describe_holder(place.acquired) if place is not None else "unknown"
            self.lost = f"labgrid place '{name}' lost while measuring (now held by {holder})"
            log.warning("device %s: %s", name, self.lost)
            return

    async def _stop_renewing(self) -> None:
        t, self._task = self._task, None
        if t is not None:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def release(self) -> str | None:
        """Stop renewing and free the place if it is still ours. Returns why it was lost while held
        (or None). Never raises: a place whose release cannot reach the coordinator is taken over by
        the next acquirer (at once on this host; after the TTL from elsewhere)."""
        c, self.client = self.client, None
        if c is None:
            return self.lost
        try:
            c.run(self._stop_renewing(), 15)  # before the release: a renewal must not take it back
            c.rpc("ReleasePlace", placename=self.device, fromuser=c.holder)  # a no-op if it is not ours
        except (DeviceError, OSError) as exc:
            self.last_error = str(exc)
            log.warning("device %s: could not release the labgrid place: %s", self.device, exc)
        finally:
            with _HELD_LOCK:
                _HELD.discard(self.key)
            c.close()
        return self.lost


def place_ttl() -> float:
    raw = os.environ.get(TTL_ENV)
    if not raw:
        return DEFAULT_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        raise BadInputError(f"{TTL_ENV}={raw!r} is not a number of seconds", hint=f"e.g. {TTL_ENV}=60") from None
    if not 0.5 <= ttl <= 86400:
        raise BadInputError(f"{TTL_ENV}={raw} is out of range", hint="between 0.5 and 86400 seconds")
    return ttl


def session_place(device: str, *, wait: bool, timeout: float | None,
                  progress: Callable[[str], None] | None = None) -> PlaceReservation | None:
    """The labgrid place a DeviceSession holds on an inventory device: None without
    ``EDGEKIT_COORDINATOR``; otherwise acquired (or an error: unreachable, no such place, held)."""
    address = address_from_env()
    if address is None:
        return None
    return PlaceReservation(device, address, ttl_s=place_ttl(), say=progress).acquire(wait=wait, timeout=timeout)


def place_holders(address: Address | None = None) -> dict[str, PlaceView]:
    """Every place on the coordinator (``EDGEKIT_COORDINATOR`` unless given), for listings."""
    address = address or address_from_env()
    if address is None:
        raise BadInputError(f"no coordinator: set {ENV}=HOST:PORT or pass --coordinator")
    with Coordinator(address) as c:
        return c.places()
