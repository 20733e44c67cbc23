"""The tuning database: every measurement the tuner made, in SQLite (the standard library's sqlite3).

Tables (schema version SCHEMA):

    kiln_tuning(key, value)          this file is a Kiln tuning database: schema version, created by
    workloads(sig, klass, definition, flops)                  a kernel's compute definition (tune/workload.py)
    targets(tkey, description)                                a machine kind: cpu, features, caches, threads
    measurements(id, sig, tkey, config, status, seconds, samples, features, analytic, is_default, detail,
                 run, created)                                every candidate measured, failures included
    best(sig, tkey, config, seconds, default_seconds, run, updated)   what `kiln.compile` applies

A measurement's status: ok (timed, output checked), wrong (output differs from the reference: never kept),
crash (the measuring process died: signal or exit code in `detail`), timeout (killed after its time limit),
error (compile or schedule error), illegal (rejected before code generation). `best` is written when the search
of a workload ends (after its verification run against the default): the default itself when nothing beat it.

The default file is `tuning.db` in Kiln's cache directory ($KILN_CACHE_DIR, else ~/.cache/kiln). A file that is
not an SQLite database, is damaged, or is some other program's database is a TuningDatabaseError naming it —
never silently used or overwritten."""
from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kiln.cachedir import cache_dir
from kiln.errors import KilnError

SCHEMA = 1
MARKER = "kiln-tuning-db"
STATUSES = ("ok", "wrong", "crash", "timeout", "error", "illegal")

_TABLES = """
CREATE TABLE IF NOT EXISTS kiln_tuning (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workloads (sig TEXT PRIMARY KEY, klass TEXT NOT NULL, definition TEXT NOT NULL,
                                      flops REAL NOT NULL);
CREATE TABLE IF NOT EXISTS targets (tkey TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sig TEXT NOT NULL REFERENCES workloads(sig),
    tkey TEXT NOT NULL REFERENCES targets(tkey),
    config TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'wrong', 'crash', 'timeout', 'error', 'illegal')),
    seconds REAL,
    samples TEXT,
    features TEXT,
    analytic REAL,
    is_default INTEGER NOT NULL DEFAULT 0,
    detail TEXT,
    run TEXT,
    created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS measurements_by_workload ON measurements (sig, tkey, status);
CREATE TABLE IF NOT EXISTS best (
    sig TEXT NOT NULL, tkey TEXT NOT NULL, config TEXT NOT NULL, seconds REAL NOT NULL,
    default_seconds REAL NOT NULL, run TEXT, updated REAL NOT NULL, PRIMARY KEY (sig, tkey));
"""


class TuningDatabaseError(KilnError):
    """A tuning database file that cannot be used (not SQLite, damaged, another program's, a newer schema)."""


def default_path() -> str:
    return os.path.join(cache_dir(), "tuning.db")


@dataclass
class Measurement:
    sig: str
    tkey: str
    config: dict[str, Any]
    status: str
    seconds: float | None = None
    samples: list[float] | None = None
    features: list[float] | None = None
    analytic: float | None = None
    is_default: bool = False
    detail: str = ""
    run: str = ""
    id: int | None = None


@dataclass
class Best:
    config: dict[str, Any]
    seconds: float
    default_seconds: float

    @property
    def speedup(self) -> float:
        return self.default_seconds / self.seconds if self.seconds > 0 else 1.0


def _config_text(config: dict[str, Any]) -> str:
    return json.dumps(dict(sorted(config.items())), separators=(",", ":"))


class TuningDatabase:
    """One open tuning database file. `TuningDatabase(path)` creates it if absent (`create=False`: a missing
    file is an error); every write is committed at once (an interrupted tuning run keeps what it measured)."""

    def __init__(self, path: str | os.PathLike | None = None, create: bool = True):
        self.path = os.fspath(path) if path is not None else default_path()
        exists = os.path.exists(self.path)
        if not exists and not create:
            raise TuningDatabaseError(f"tuning database {self.path} does not exist")
        if exists and os.path.isdir(self.path):
            raise TuningDatabaseError(f"tuning database {self.path} is a directory, not a file")
        if not exists:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        try:
            self.conn = sqlite3.connect(self.path, timeout=30.0)
            self.conn.execute("PRAGMA foreign_keys = ON")
            self._check_or_create(exists)
        except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed", ...
            self._close_quietly()
            raise TuningDatabaseError(f"{self.path} is not a usable Kiln tuning database: {e}") from None

    def _close_quietly(self) -> None:
        try:
            self.conn.close()
        except (AttributeError, sqlite3.Error):
            pass

    def _check_or_create(self, existed: bool) -> None:
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if existed and tables:
            if "kiln_tuning" not in tables:
                raise TuningDatabaseError(f"{self.path} is an SQLite database of another program (tables "
                                          f"{', '.join(sorted(tables))}), not a Kiln tuning database")
            meta = dict(self.conn.execute("SELECT key, value FROM kiln_tuning"))
            if meta.get("marker") != MARKER:
                raise TuningDatabaseError(f"{self.path} has a kiln_tuning table but no Kiln marker")
            if int(meta.get("schema", "0")) > SCHEMA:
                raise TuningDatabaseError(f"{self.path} has tuning schema {meta.get('schema')}; this Kiln reads "
                                          f"up to {SCHEMA}")
            problem = self.conn.execute("PRAGMA quick_check").fetchone()[0]
            if problem != "ok":
                raise TuningDatabaseError(f"{self.path} is damaged: {problem}")
            return
        with self.conn:
            self.conn.executescript(_TABLES)
            self.conn.executemany("INSERT OR REPLACE INTO kiln_tuning VALUES (?, ?)",
                                  [("marker", MARKER), ("schema", str(SCHEMA)), ("created", str(time.time()))])

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> TuningDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self.conn:
            yield self.conn

    # -- writing ---------------------------------------------------------------------------------------------------
    def add_workload(self, sig: str, klass: str, definition: str, flops: float) -> None:
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO workloads VALUES (?, ?, ?, ?)", (sig, klass, definition, float(flops)))

    def add_target(self, tkey: str, description: dict) -> None:
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO targets VALUES (?, ?)", (tkey, json.dumps(description, sort_keys=True)))

    def add(self, m: Measurement) -> int:
        if m.status not in STATUSES:
            raise ValueError(f"measurement status {m.status!r} is not one of {STATUSES}")
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO measurements (sig, tkey, config, status, seconds, samples, features, analytic, "
                "is_default, detail, run, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (m.sig, m.tkey, _config_text(m.config), m.status, m.seconds,
                 json.dumps(m.samples) if m.samples is not None else None,
                 json.dumps(m.features) if m.features is not None else None, m.analytic, int(m.is_default),
                 m.detail[:2000], m.run, time.time()))
            m.id = int(cur.lastrowid)
        return m.id

    def set_best(self, sig: str, tkey: str, config: dict[str, Any], seconds: float, default_seconds: float,
                 run: str = "") -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO best VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (sig, tkey, _config_text(config), float(seconds), float(default_seconds), run, time.time()))

    # -- reading ---------------------------------------------------------------------------------------------------
    def best(self, sig: str, tkey: str) -> Best | None:
        row = self.conn.execute("SELECT config, seconds, default_seconds FROM best WHERE sig = ? AND tkey = ?",
                                (sig, tkey)).fetchone()
        return None if row is None else Best(json.loads(row[0]), row[1], row[2])

    def bests(self, tkey: str) -> dict[str, Best]:
        rows = self.conn.execute("SELECT sig, config, seconds, default_seconds FROM best WHERE tkey = ? ORDER BY sig",
                                 (tkey,))
        return {r[0]: Best(json.loads(r[1]), r[2], r[3]) for r in rows}

    def default_of(self, sig: str, tkey: str) -> tuple[dict[str, Any], float] | None:
        """The workload's default configuration and its latest measured time on this target."""
        row = self.conn.execute("SELECT config, seconds FROM measurements WHERE sig = ? AND tkey = ? AND "
                                "is_default = 1 AND status = 'ok' ORDER BY id DESC LIMIT 1", (sig, tkey)).fetchone()
        return None if row is None else (json.loads(row[0]), row[1])

    def fingerprint(self, tkey: str) -> str:
        """What the compile cache keys on: the best records for one target (a new one changes it)."""
        import hashlib
        rows = self.conn.execute("SELECT sig, config FROM best WHERE tkey = ? ORDER BY sig", (tkey,)).fetchall()
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16] if rows else ""

    def measurements(self, sig: str | None = None, tkey: str | None = None, status: str | None = None
                     ) -> list[Measurement]:
        where, args = [], []
        for col, val in (("sig", sig), ("tkey", tkey), ("status", status)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        q = ("SELECT id, sig, tkey, config, status, seconds, samples, features, analytic, is_default, detail, run "
             "FROM measurements" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id")
        out = []
        for r in self.conn.execute(q, args):
            out.append(Measurement(r[1], r[2], json.loads(r[3]), r[4], r[5], json.loads(r[6]) if r[6] else None,
                                   json.loads(r[7]) if r[7] else None, r[8], bool(r[9]), r[10] or "", r[11] or "",
                                   r[0]))
        return out

    def count(self, sig: str | None = None, tkey: str | None = None) -> int:
        return len(self.measurements(sig, tkey))

    def workload_class(self, sig: str) -> str | None:
        row = self.conn.execute("SELECT klass FROM workloads WHERE sig = ?", (sig,)).fetchone()
        return row[0] if row else None

    def workloads(self) -> list[tuple[str, str, float]]:
        return [tuple(r) for r in self.conn.execute("SELECT sig, klass, flops FROM workloads ORDER BY sig")]

    def symbolic_sigs(self) -> set[str]:
        """Workloads over symbolic dims: their definitions list the sizes they are measured at (tune/sizes.py)."""
        return {r[0] for r in self.conn.execute(
            "SELECT sig FROM workloads WHERE instr(definition, char(10) || 'sizes [') > 0")}

    def tkeys(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT tkey FROM targets ORDER BY tkey")]


def open_for_compile(path: str | None) -> TuningDatabase | None:
    """The database `kiln.compile(tuning=...)` reads: None when the file does not exist (nothing to apply — and
    compiling never creates one); a TuningDatabaseError when it exists but cannot be used."""
    p = path or default_path()
    if not os.path.exists(p):
        return None
    return TuningDatabase(p, create=False)
