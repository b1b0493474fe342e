"""FakeBackend: N GPUs with scriptable values and injectable faults.

Public on purpose: use it for demos and in your own tests, e.g.

    fake = FakeBackend(gpus=2)
    fake.set(0, temperature_celsius=86)          # pin a value
    fake.inject_xid(0, 79)                       # the GPU fell off the bus
    fake.add_ecc(1, uncorrected=1)               # a double-bit error
    fake.throttle(0, "hw_thermal")               # clock-event reason + lower clocks
    fake.lose(1)                                 # NVML_ERROR_GPU_IS_LOST from now on
    fake.silence(1)                              # no sample at all from now on (fell off the bus)
    fake.unsupported(0, "power_watts")           # NOT_SUPPORTED, as NVML says on some boards
    fake.enable_mig(0, ["3g.71gb", "1g.18gb"])   # MIG mode with these GPU instances
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import fields, replace

from gpulens.errors import BadInputError, shown
from gpulens.gpu.types import CLOCK_EVENT_LABELS, GpuInfo, GpuProcess, GpuSample, MigInstanceSample, XidEvent

_SAMPLE_FIELDS = {f.name for f in fields(GpuSample)}
_REASON_BITS = {name: int(bit) for bit, name in CLOCK_EVENT_LABELS.items()}

H200_LIKE = dict(
    name="NVIDIA H200",
    memory_total_bytes=150_754_820_096,
    temperature_slowdown_celsius=89.0,
    temperature_shutdown_celsius=95.0,
    sm_clock_max_hz=1980e6,
    memory_clock_max_hz=3201e6,
    power_limit_watts=700.0,
)
_H200_FACTS = {k: v for k, v in H200_LIKE.items() if k != "name"}  # the GpuInfo fields, by keyword
FAKE_DRIVER_VERSION = "580.159.04"  # the probed H200's driver
_RESERVED_BYTES = 536_870_912  # what an H200's driver and firmware hold back (0.5 GiB)


class FakeBackend:
    """A scriptable stand-in for NVML. Values follow a smooth, seeded load pattern unless pinned."""

    name = "fake"
    paced = False  # sampled on the wall clock, at the pipeline's interval
    source_time: float | None = None

    def __init__(
        self,
        gpus: int = 1,
        *,
        clock: Callable[[], float] = time.time,
        seed: int = 0,
        model: str = H200_LIKE["name"],  # type: ignore[assignment]
    ):
        if gpus < 1:
            raise BadInputError(f"A fake backend needs at least one GPU, not {gpus}.", hint="Use fake:1 or more.")
        self._clock = clock
        self._rng = random.Random(seed)
        self._infos = [
            GpuInfo(
                index=i,
                uuid=f"GPU-fake-{seed:04d}-{i:04d}",
                name=model,
                **_H200_FACTS,  # type: ignore[arg-type]
                pci_bus_id=f"00000000:{i + 1:02x}:00.0",
                minor_number=i,
                driver_version=FAKE_DRIVER_VERSION,
            )
            for i in range(gpus)
        ]
        n = len(self._infos)
        self._pinned: list[dict[str, object]] = [{} for _ in range(n)]
        self._unsupported: list[set[str]] = [set() for _ in range(n)]
        self._lost = [False] * n
        self._silent = [False] * n
        self._throttle = [0] * n
        self._ecc = [{"corrected": 0, "uncorrected": 0} for _ in range(n)]
        self._remap = [{"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False} for _ in range(n)]
        self._energy_j = [0.0] * n
        self._last_t: float | None = None
        self._processes: list[list[GpuProcess]] = [[] for _ in range(n)]
        self._mig: list[list[str] | None] = [None] * n  # MIG profiles per GPU, None: MIG off
        self._nvlink_bytes = [0.0] * n
        self._xids: list[XidEvent] = []
        self._scheduled: list[tuple[float, Callable[[], None]]] = []
        self._t0 = clock()

    # ------------------------------------------------------------ scripting
    def _check(self, gpu: int) -> None:
        if not 0 <= gpu < len(self._infos):
            raise BadInputError(f"The fake backend has GPUs 0..{len(self._infos) - 1}, not {gpu}.")

    def set(self, gpu: int, **values: object) -> None:
        """Pin sample fields of one GPU (e.g. temperature_celsius=85). None un-pins a field."""
        self._check(gpu)
        for k, v in values.items():
            if k not in _SAMPLE_FIELDS:
                raise BadInputError(f"GpuSample has no field {k!r}.", hint="See gpulens.gpu.types.GpuSample.")
            if v is None:
                self._pinned[gpu].pop(k, None)
            else:
                self._pinned[gpu][k] = v

    def unsupported(self, gpu: int, *field_names: str) -> None:
        """Make fields read as NOT_SUPPORTED (None) on one GPU."""
        self._check(gpu)
        self._unsupported[gpu].update(field_names)

    def inject_xid(self, gpu: int, xid: int) -> None:
        self._check(gpu)
        self._xids.append(XidEvent(t=self._clock(), gpu=gpu, uuid=self._infos[gpu].uuid, xid=int(xid)))

    def add_ecc(self, gpu: int, *, corrected: int = 0, uncorrected: int = 0) -> None:
        self._check(gpu)
        self._ecc[gpu]["corrected"] += corrected
        self._ecc[gpu]["uncorrected"] += uncorrected

    def fail_remapping(self, gpu: int, *, pending: bool = False) -> None:
        """A remapping failure (or, with pending=True, a remapping waiting for reset)."""
        self._check(gpu)
        r = self._remap[gpu]
        r["uncorrectable"] += 1  # type: ignore[operator]
        if pending:
            r["pending"] = True
        else:
            r["failure"] = True

    def throttle(self, gpu: int, *reasons: str) -> None:
        """Activate clock-event reasons (hw_slowdown, hw_thermal, sw_thermal, hw_power_brake, sw_power_cap)."""
        self._check(gpu)
        for r in reasons:
            if r not in _REASON_BITS:
                raise BadInputError(f"Unknown clock-event reason {r!r}.", hint=f"Use one of {sorted(_REASON_BITS)}.")
            self._throttle[gpu] |= _REASON_BITS[r]

    def lose(self, gpu: int) -> None:
        """From now on the GPU answers NVML_ERROR_GPU_IS_LOST."""
        self._check(gpu)
        self._lost[gpu] = True

    def silence(self, gpu: int) -> None:
        """From now on the GPU sends nothing: a GPU that fell off the bus (XID 79) is no longer
        listed, so no sample comes from it, not even `gpu_up == 0`."""
        self._check(gpu)
        self._silent[gpu] = True

    def add_process(self, gpu: int, pid: int, name: str, used_memory_bytes: int | None) -> None:
        self._check(gpu)
        self._processes[gpu].append(GpuProcess(pid=pid, name=name, used_memory_bytes=used_memory_bytes))

    def clear(self, gpu: int) -> None:
        """Clear every fault of one GPU (not pinned values, processes or counters)."""
        self._check(gpu)
        self._throttle[gpu] = 0
        self._lost[gpu] = False
        self._silent[gpu] = False
        self._unsupported[gpu].clear()
        self._remap[gpu]["pending"] = False
        self._remap[gpu]["failure"] = False

    def enable_mig(self, gpu: int, profiles: list[str]) -> None:
        """MIG mode on one GPU, with one GPU instance per profile name (e.g. "1g.18gb"); the memory
        of each is the number before "gb"."""
        self._check(gpu)
        _check_mig_profiles(profiles)
        self._mig[gpu] = list(profiles)

    def schedule(self, after_seconds: float, action: Callable[[], None]) -> None:
        """Run `action` at the first sample at least `after_seconds` after the backend was made."""
        self._scheduled.append((self._t0 + after_seconds, action))

    # ------------------------------------------------------------ backend
    def gpus(self) -> list[GpuInfo]:
        return list(self._infos)

    @property
    def exhausted(self) -> bool:
        return False

    def drain_xid_events(self) -> list[XidEvent]:
        out, self._xids = self._xids, []
        return out

    def close(self) -> None:
        pass

    def sample(self) -> list[GpuSample]:
        now = self._clock()
        due = [a for when, a in self._scheduled if when <= now]
        self._scheduled = [(w, a) for w, a in self._scheduled if w > now]
        for action in due:
            action()
        dt = 0.0 if self._last_t is None else max(0.0, now - self._last_t)
        self._last_t = now
        return [self._sample_one(info, now, dt) for info in self._infos if not self._silent[info.index]]

    def _sample_one(self, info: GpuInfo, now: float, dt: float) -> GpuSample:
        i = info.index
        if self._lost[i]:
            return GpuSample(t=now, gpu=i, uuid=info.uuid, name=info.name, lost=True)
        phase = (now - self._t0) / 60.0 * 2 * math.pi + i
        load = 0.55 + 0.35 * math.sin(phase) + self._rng.uniform(-0.03, 0.03)
        load = min(1.0, max(0.0, load))
        mask = self._throttle[i] or (0x1 if load < 0.05 else 0)
        slowed = self._throttle[i] & (0x8 | 0x40 | 0x80 | 0x20)
        sm_hz = info.sm_clock_max_hz * (0.5 if slowed else 0.95)  # type: ignore[operator]
        power_w = 90.0 + 560.0 * load
        self._energy_j[i] += power_w * dt
        self._nvlink_bytes[i] += 25e9 * load * dt  # a quarter of an H200 link's 100 GB/s per direction at full load
        total = info.memory_total_bytes or 0
        r, e = self._remap[i], self._ecc[i]
        s = GpuSample(
            t=now,
            gpu=i,
            uuid=info.uuid,
            name=info.name,
            utilization_gpu_ratio=round(load, 2),
            utilization_memory_copy_ratio=round(load * 0.4, 2),
            utilization_encoder_ratio=0.0,
            utilization_decoder_ratio=0.0,
            memory_used_bytes=float(int(total * (0.2 + 0.3 * load))),
            memory_free_bytes=float(total - _RESERVED_BYTES - int(total * (0.2 + 0.3 * load))),
            memory_reserved_bytes=float(_RESERVED_BYTES),
            memory_total_bytes=float(total),
            temperature_celsius=float(round(35 + 40 * load)),
            memory_temperature_celsius=float(round(40 + 35 * load)),
            temperature_slowdown_celsius=info.temperature_slowdown_celsius,
            temperature_shutdown_celsius=info.temperature_shutdown_celsius,
            power_watts=round(power_w, 3),
            power_limit_watts=info.power_limit_watts,
            energy_joules=round(self._energy_j[i], 3),
            sm_clock_hz=sm_hz,
            memory_clock_hz=info.memory_clock_max_hz,
            sm_clock_max_hz=info.sm_clock_max_hz,
            memory_clock_max_hz=info.memory_clock_max_hz,
            clock_event_mask=mask,
            performance_state=0,
            pcie_tx_bytes_per_second=1.0e6 * load,
            pcie_rx_bytes_per_second=0.5e6 * load,
            pcie_replay_total=0.0,
            nvlink_bytes_total=round(self._nvlink_bytes[i]),
            ecc_corrected_volatile_total=float(e["corrected"]),
            ecc_uncorrected_volatile_total=float(e["uncorrected"]),
            ecc_corrected_aggregate_total=float(e["corrected"]),
            ecc_uncorrected_aggregate_total=float(e["uncorrected"]),
            remapped_rows_correctable=float(r["correctable"]),  # type: ignore[arg-type]
            remapped_rows_uncorrectable=float(r["uncorrectable"]),  # type: ignore[arg-type]
            remapped_rows_pending=bool(r["pending"]),
            remapped_rows_failure=bool(r["failure"]),
            graphics_active_ratio=round(load * 0.95, 3),
            sm_active_ratio=round(load * 0.9, 3),
            sm_occupancy_ratio=round(load * 0.3, 3),
            tensor_active_ratio=round(load * 0.5, 3),
            dram_active_ratio=round(load * 0.4, 3),
            mig_mode=self._mig[i] is not None,
            processes=list(self._processes[i]),
            mig_instances=self._mig_samples(info, load),
        )
        if s.mig_mode:  # as NVML: no GPM for the whole GPU in MIG mode, per GPU instance instead
            s.graphics_active_ratio = s.sm_active_ratio = s.sm_occupancy_ratio = None
            s.tensor_active_ratio = s.dram_active_ratio = None
            # and the whole GPU's memory in use is its instances' (what a MIG sum must come back to)
            used_bytes = sum(m.memory_used_bytes or 0.0 for m in s.mig_instances or ())
            s.memory_used_bytes = used_bytes
            s.memory_free_bytes = float(total - _RESERVED_BYTES - used_bytes)
        if self._pinned[i]:
            s = replace(s, **self._pinned[i])
        for name in self._unsupported[i]:
            setattr(s, name, None)
            s.errors[name] = "NVML_ERROR_NOT_SUPPORTED"
        return s

    def _mig_samples(self, info: GpuInfo, load: float) -> list[MigInstanceSample] | None:
        profiles = self._mig[info.index]
        if profiles is None:
            return None
        out = []
        for k, profile in enumerate(profiles):
            total = float(profile.split(".", 1)[1].removesuffix("gb")) * 1e9
            used = float(int(total * (0.1 + 0.5 * load)))
            out.append(MigInstanceSample(
                gpu_instance_id=k + 1, compute_instance_id=0, profile=profile,
                uuid=f"MIG-{info.uuid.removeprefix('GPU-')}-{k + 1:02d}",
                memory_used_bytes=used, memory_free_bytes=total - used, memory_total_bytes=total,
                graphics_active_ratio=round(load * 0.95, 3), sm_active_ratio=round(load * 0.9, 3),
                sm_occupancy_ratio=round(load * 0.3, 3), tensor_active_ratio=round(load * 0.5, 3),
                dram_active_ratio=round(load * 0.4, 3), device_index=k,
            ))
        return out


def _check_mig_profiles(profiles: list[str]) -> None:
    for p in profiles:
        size = p.partition(".")[2].removesuffix("gb")
        if not p.endswith("gb") or not size.isdigit():
            raise BadInputError(f"Cannot read the MIG profile {p!r}.", hint="Write profiles as NVML names them, e.g. 1g.18gb or 3g.71gb.")


MAX_FAKE_GPUS = 1024
# Fields a fault may not make NOT_SUPPORTED: who the GPU is, and the sample's own bookkeeping.
_NOT_UNSUPPORTABLE = {"t", "gpu", "uuid", "name", "lost", "errors"}


def parse_fake_spec(spec: str) -> int:
    """`fake` or `fake:N` -> N GPUs."""
    _, _, n = spec.partition(":")
    if not n:
        return 1
    n = n.removeprefix("gpus=")
    try:
        count = int(n)
    except ValueError:
        raise BadInputError(f"Cannot read the GPU count in --backend {shown(spec)}.", hint="Write fake:8 for eight fake GPUs.") from None
    if count < 1:
        raise BadInputError(f"--backend {shown(spec)} asks for {count} GPUs.", hint="Ask for at least one: fake:1.")
    if count > MAX_FAKE_GPUS:  # a typo such as fake:99999999999999999999 used to hang allocating
        raise BadInputError(f"--backend {shown(spec)} asks for {count} GPUs; a fake node has at most {MAX_FAKE_GPUS}.",
                            hint="Write e.g. fake:8.")
    return count


_MAX_FAULT_COUNT = 2**31 - 1  # an XID code or an ECC count as NVML reports it

FAULT_HELP = (
    "KIND[:ARG]@SECONDS[:gpu=N]; kinds: xid:CODE, ecc:corrected=N|uncorrected=N, throttle:REASON, "
    "remap-failure, remap-pending, lost, silent, temp:CELSIUS, unsupported:FIELD, mig:PROFILE+PROFILE. "
    "Example: xid:79@5s:gpu=0"
)


def schedule_fault(fake: FakeBackend, spec: str) -> None:
    """Schedule a fault from a command-line spec such as `xid:79@5s:gpu=1` (see FAULT_HELP)."""
    from gpulens.units import parse_duration

    body, at, when = spec.partition("@")
    if at and not when.partition(":gpu=")[0].strip():  # "xid:79@" names no time; without "@" it is at once
        raise BadInputError(f"--fault {shown(spec)} gives no time after '@'.", hint=FAULT_HELP)
    gpu = 0
    if ":gpu=" in when:
        when, _, g = when.partition(":gpu=")
        try:
            gpu = int(g)
        except ValueError:
            raise BadInputError(f"Cannot read the GPU in --fault {shown(spec)}.", hint=FAULT_HELP) from None
    after = parse_duration(when or "0", what="fault time", allow_zero=True)
    kind, _, arg = body.partition(":")
    fake._check(gpu)

    def bad() -> BadInputError:
        return BadInputError(f"Cannot read --fault {shown(spec)}.", hint=FAULT_HELP)

    action: Callable[[], None]
    try:
        # a value no GPU reports (XID -5 or 10**20, -3 ECC errors, a temperature of inf) was
        # injected, and the store dropped its samples with a warning
        if kind == "xid":
            code = int(arg)
            if not 1 <= code <= _MAX_FAULT_COUNT:
                raise bad()
            action = lambda: fake.inject_xid(gpu, code)  # noqa: E731
        elif kind == "ecc":
            which, _, n = arg.partition("=")
            if which not in ("corrected", "uncorrected"):
                raise bad()
            count = int(n or 1)
            if not 0 <= count <= _MAX_FAULT_COUNT:
                raise bad()
            action = lambda: fake.add_ecc(gpu, **{which: count})  # noqa: E731
        elif kind == "throttle":
            if arg not in _REASON_BITS:
                raise bad()
            action = lambda: fake.throttle(gpu, arg)  # noqa: E731
        elif kind == "remap-failure":
            action = lambda: fake.fail_remapping(gpu)  # noqa: E731
        elif kind == "remap-pending":
            action = lambda: fake.fail_remapping(gpu, pending=True)  # noqa: E731
        elif kind == "lost":
            action = lambda: fake.lose(gpu)  # noqa: E731
        elif kind == "silent":
            action = lambda: fake.silence(gpu)  # noqa: E731
        elif kind == "temp":
            celsius = float(arg)
            if not -273.15 <= celsius <= 1000:  # NaN fails too
                raise bad()
            action = lambda: fake.set(gpu, temperature_celsius=celsius)  # noqa: E731
        elif kind == "mig":
            profiles = [p for p in arg.split("+") if p]
            if not profiles:
                raise bad()
            _check_mig_profiles(profiles)  # now, so that a bad profile fails at start
            action = lambda: fake.enable_mig(gpu, profiles)  # noqa: E731
        elif kind == "unsupported":
            if arg not in _SAMPLE_FIELDS or arg in _NOT_UNSUPPORTABLE:
                raise bad()
            action = lambda: fake.unsupported(gpu, arg)  # noqa: E731
        else:
            raise bad()
    except ValueError:
        raise bad() from None
    fake.schedule(after, action)
