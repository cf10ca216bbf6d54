//! The runner's history: every run (its command, inputs, the plugins it used with their
//! sha256, and its results) in an embedded SQLite database.
//!
//! Durability is SQLite's: write-ahead logging with a synchronous commit per write, so a
//! process killed with SIGKILL loses nothing already written; a busy timeout, so two
//! runners writing at once wait for each other instead of failing or corrupting the file.
//! A long run writes each finished item (one GPU count, one point of a sweep) as it goes
//! ([`Store::put_item`]); started again with the same inputs it finds the unfinished run
//! and its items ([`Store::begin`]), so it resumes where it stopped.
//!
//! The file grows with every run (a large explore keeps a few MB of renderings, so that
//! `runner show` reprints it byte for byte); [`Store::prune`] deletes old runs with their
//! items in one transaction and gives the space back (VACUUM).
//!
//! Key items: [`Store`] (open, begin, put_item, finish, list, get, prune), [`Run`], [`diff`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A run's id in the store.
pub type RunId = i64;

/// What a store call failed on, with the database path.
#[derive(Debug)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreError {}

type R<T> = Result<T, StoreError>;

/// The history database.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

/// One stored run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Run {
    pub id: RunId,
    /// "run", "explore", ...
    pub kind: String,
    /// The command line, for people.
    pub command: String,
    pub started: String,
    pub finished: Option<String>,
    /// running, done or failed.
    pub status: String,
    pub inputs: Value,
    /// Every plugin used: name, path, sha256.
    pub plugins: Value,
    pub result: Option<Value>,
    /// Items written as the run went (key, value), in order.
    pub items: Vec<(String, Value)>,
    pub runner_version: String,
    /// The process that runs (or ran) it; 0 where unknown (a history from before it was
    /// recorded).
    #[serde(skip)]
    pub owner_pid: u32,
}

impl Run {
    /// The status as it stands now: "interrupted" for a run still marked running whose
    /// process is gone (killed; started again with the same inputs, it resumes).
    pub fn state(&self) -> &str {
        state(&self.status, self.owner_pid)
    }
}

/// A run's line in a listing.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub id: RunId,
    pub kind: String,
    pub command: String,
    pub started: String,
    pub status: String,
    pub items: i64,
    /// The process that runs (or ran) it; 0 where unknown.
    #[serde(skip)]
    pub owner_pid: u32,
}

impl Summary {
    /// As [`Run::state`].
    pub fn state(&self) -> &str {
        state(&self.status, self.owner_pid)
    }
}

fn state(status: &str, owner_pid: u32) -> &str {
    if status == "running" && !process_alive(owner_pid) { "interrupted" } else { status }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    command TEXT NOT NULL,
    inputs TEXT NOT NULL,
    inputs_sha256 TEXT NOT NULL,
    plugins TEXT NOT NULL,
    started TEXT NOT NULL,
    finished TEXT,
    status TEXT NOT NULL,
    result TEXT,
    runner_version TEXT NOT NULL,
    owner_pid INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_by_inputs ON runs (inputs_sha256, status);
CREATE TABLE IF NOT EXISTS items (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
";

/// Columns added to the schema after its first release: (table, column, definition). A
/// history written before one of them was added gets it on open ([`migrate`]), or every
/// query naming it would fail ("no such column").
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[("runs", "owner_pid", "INTEGER NOT NULL DEFAULT 0")];

/// Whether `table` lacks any of [`ADDED_COLUMNS`].
fn missing_columns(c: &Connection) -> rusqlite::Result<Vec<(&'static str, &'static str, &'static str)>> {
    let mut out = Vec::new();
    for &(table, column, definition) in ADDED_COLUMNS {
        let mut st = c.prepare(&format!("PRAGMA table_info({table})"))?;
        let names = st.query_map([], |r| r.get::<_, String>(1))?.collect::<rusqlite::Result<Vec<String>>>()?;
        if !names.iter().any(|n| n == column) {
            out.push((table, column, definition));
        }
    }
    Ok(out)
}

/// Bring a history made by an older runner up to [`SCHEMA`]: add the columns it lacks.
/// Checked and altered under the write lock, so two runners opening the same old file at
/// once do not both add a column (the second would fail "duplicate column name").
fn migrate(c: &Connection) -> rusqlite::Result<()> {
    if missing_columns(c)?.is_empty() {
        return Ok(());
    }
    c.execute_batch("BEGIN IMMEDIATE")?;
    let altered = (|| {
        for (table, column, definition) in missing_columns(c)? {
            c.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {definition}"))?;
        }
        Ok(())
    })();
    match altered {
        Ok(()) => c.execute_batch("COMMIT"),
        Err(e) => {
            let _ = c.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// How long a runner waits for another one holding the database.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// A database error in words, with the fix where there is one: a damaged file (a crash
/// mid-write on a filesystem that lies about syncs, a copy taken while a run wrote it) or a
/// file that is some other program's database.
fn explain(path: &Path, e: &dyn std::fmt::Display, code: Option<rusqlite::ErrorCode>) -> StoreError {
    let p = path.display();
    let fix = match code {
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => format!(
            ": the file is damaged; move it aside to start a new history (mv {p} {p}.damaged), or recover what it holds \
             with `sqlite3 {p}.damaged .recover | sqlite3 {p}`"
        ),
        Some(rusqlite::ErrorCode::NotADatabase) => ": not an SQLite database; point --history (or RUNNER_HISTORY) at a runner history file".into(),
        // After the busy timeout: another process kept the lock all that time.
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => format!(
            ": another process held it for over {} s (a runner writing a long run, or a program with it open: \
             `lsof {p}` names it); try again once it is done, or give --history FILE",
            BUSY_TIMEOUT.as_secs()
        ),
        _ => String::new(),
    };
    StoreError(format!("history database {p}: {e}{fix}"))
}

/// A history path that is there but is no regular file: a directory (the file beside
/// it is meant), or a device, pipe or socket, which SQLite answered "disk I/O error"
/// (`--history /dev/null`).
fn refuse_what_is_not_a_file(path: &Path) -> R<()> {
    let p = path.display();
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(StoreError(format!(
            "history database {p}: is a directory; point --history (or RUNNER_HISTORY) at a file in it ({})",
            path.join("history.sqlite").display()
        ))),
        Ok(m) if !m.is_file() => Err(StoreError(format!(
            "history database {p}: not a regular file (a device, a pipe or a socket); point --history (or \
             RUNNER_HISTORY) at a runner history file"
        ))),
        _ => Ok(()),
    }
}

fn sqlite_code(e: &rusqlite::Error) -> Option<rusqlite::ErrorCode> {
    e.sqlite_error_code()
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
}

/// The time now, UTC, RFC 3339 to the second (`2026-12-01T10:24:11Z`): what the history
/// records and what other records (a measurement file) are dated with.
pub fn now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    rfc3339_utc(secs)
}

/// `secs` since the Unix epoch as [`now`] writes a time.
fn rfc3339_utc(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The default database: `$RUNNER_HISTORY`, else `runner/history.sqlite` in the user's
/// data directory (on Linux `$XDG_DATA_HOME`, else `~/.local/share`; an empty or relative
/// `$XDG_DATA_HOME` is ignored, as the XDG spec says, and so is a relative `$HOME`: each
/// working directory would get a history of its own). An empty `$RUNNER_HISTORY` is unset
/// too: SQLite opens the empty name as a temporary database deleted on close, so every
/// run said "kept as run 1" and was lost. A relative `$RUNNER_HISTORY`, named by the user
/// as `--history FILE` is, is taken relative to the working directory.
pub fn default_path() -> Option<PathBuf> {
    path_from(std::env::var_os("RUNNER_HISTORY"), dirs::data_dir())
}

/// [`default_path`] from `$RUNNER_HISTORY` and the user's data directory.
fn path_from(history: Option<std::ffi::OsString>, data_dir: Option<PathBuf>) -> Option<PathBuf> {
    match history {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => Some(data_dir.filter(|d| d.is_absolute())?.join("runner").join("history.sqlite")),
    }
}

/// `path` as the path of an SQLite `file:` URI: every byte but unreserved ones and `/`
/// percent-encoded (a `?` or `#` in a directory name must not start the query).
fn uri_path(path: &Path) -> String {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = String::new();
    for b in absolute.as_os_str().as_encoded_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => out.push(*b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// What an unfinished run is found by (the `inputs_sha256` column): the sha256 of its
/// inputs, the name and sha256 of every plugin it used, the runner's version and the
/// rules its pieces were computed by. Two runs with equal keys compute equal pieces, so
/// one may resume the other. Empty `pieces` leave the key as it was before they were part
/// of it.
fn resume_key(inputs: &Value, plugins: &Value, version: &str, pieces: &str) -> String {
    let plugins: Vec<Value> = plugins
        .as_array()
        .map(|ps| ps.iter().map(|p| serde_json::json!([p.get("name"), p.get("sha256")])).collect())
        .unwrap_or_else(|| vec![plugins.clone()]);
    if pieces.is_empty() {
        return hash(&serde_json::json!({ "inputs": inputs, "plugins": plugins, "runner_version": version }));
    }
    hash(&serde_json::json!({ "inputs": inputs, "pieces": pieces, "plugins": plugins, "runner_version": version }))
}

/// The sha256 of a JSON value's canonical text (serde_json sorts object keys when
/// `preserve_order` is off, which it is here).
pub fn hash(v: &Value) -> String {
    let mut h = Sha256::new();
    h.update(v.to_string().as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl Store {
    /// Open (and create) the database at `path`.
    ///
    /// # Errors
    /// The directory cannot be created or the file is not a runner history database.
    pub fn open(path: &Path) -> R<Store> {
        let err = |e: &dyn std::fmt::Display| StoreError(format!("history database {}: {e}", path.display()));
        let db_err = |e: rusqlite::Error| explain(path, &e, sqlite_code(&e));
        refuse_what_is_not_a_file(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| err(&e))?;
        }
        let conn = Connection::open(path).map_err(|e| err(&e))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| err(&e))?;
        // WAL: readers never block the writer; FULL sync: a commit is on disk when it
        // returns, so SIGKILL (or power loss) cannot undo it. Switching a new file to WAL
        // needs an exclusive lock and SQLite answers "database is locked" at once (without
        // its busy handler) while another runner is creating the same file, so the set-up
        // is retried until the busy timeout.
        let setup = |c: &Connection| -> rusqlite::Result<()> {
            c.pragma_update(None, "journal_mode", "WAL")?;
            c.pragma_update(None, "synchronous", "FULL")?;
            c.execute_batch(SCHEMA)?;
            migrate(c)
        };
        // Another program's database (tables, none of them ours) is left as it is: the
        // set-up would switch it to WAL and add our tables to it.
        let foreign = |c: &Connection| -> rusqlite::Result<Vec<String>> {
            let mut st = c.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")?;
            let names = st.query_map([], |r| r.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<String>>>()?;
            Ok(if names.iter().any(|n| n == "runs") { Vec::new() } else { names })
        };
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        let mut pause = Duration::from_millis(2);
        loop {
            match foreign(&conn).and_then(|names| if names.is_empty() { setup(&conn).map(|()| names) } else { Ok(names) }) {
                Ok(names) if !names.is_empty() => {
                    let shown: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
                    return Err(StoreError(format!(
                        "history database {}: another program's database (tables {}{}), not a runner history; point --history \
                         (or RUNNER_HISTORY) at a runner history file, or at a new path to start one",
                        path.display(),
                        shown.join(", "),
                        if names.len() > 5 { ", ..." } else { "" }
                    )));
                }
                Ok(_) => break,
                Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Err(e) if e.to_string().contains("no such column") || e.to_string().contains("no such table") => {
                    // SQLite appends the whole schema statement: the first clause is the news.
                    let what = e.to_string();
                    let what = what.split(" in ").next().unwrap_or(&what).to_string();
                    return Err(StoreError(format!(
                        "history database {}: its tables are not a runner history's ({what}); point --history (or RUNNER_HISTORY) \
                         at a runner history file, or at a new path to start one",
                        path.display()
                    )));
                }
                Err(e) => return Err(db_err(e)),
            }
        }
        // A damaged file is said at once, not after a run was "kept" in it.
        let check: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(db_err)?;
        if check != "ok" {
            return Err(explain(path, &format!("integrity check: {check}"), Some(rusqlite::ErrorCode::DatabaseCorrupt)));
        }
        Ok(Store { conn, path: path.to_path_buf() })
    }

    /// Open an existing history to read it only, changing nothing (no tables created, no
    /// journal mode switched, no columns added): what `runner history`, `show` and
    /// `compare` fall back on when [`Store::open`] cannot write the file (another user's
    /// history, a read-only mount). A history from before a column was added needs one
    /// opening that can write.
    ///
    /// # Errors
    /// The file cannot be read, is damaged, or is not a current runner history.
    pub fn open_read_only(path: &Path) -> R<Store> {
        use rusqlite::OpenFlags;
        let db_err = |e: rusqlite::Error| explain(path, &e, sqlite_code(&e));
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let probe = |uri: &str| -> rusqlite::Result<(Connection, Vec<String>)> {
            let c = Connection::open_with_flags(uri, flags)?;
            c.busy_timeout(BUSY_TIMEOUT)?;
            let tables = {
                let mut st = c.prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?;
                st.query_map([], |r| r.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<String>>>()?
            };
            Ok((c, tables))
        };
        refuse_what_is_not_a_file(path)?;
        if !path.is_file() {
            return Err(StoreError(format!("history database {}: not a file", path.display())));
        }
        let uri = format!("file:{}?mode=ro", uri_path(path));
        // A WAL database read by one who cannot create its -shm beside it (a directory it
        // may not write) is refused as "readonly"; with no -wal there, no runner has it
        // open, so the file alone is the whole history and may be read as immutable.
        let wal = path.with_file_name(format!("{}-wal", path.file_name().unwrap_or_default().to_string_lossy()));
        let (conn, tables) = match probe(&uri) {
            Err(e) if !wal.exists() && matches!(sqlite_code(&e), Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)) => {
                probe(&format!("{uri}&immutable=1")).map_err(db_err)?
            }
            other => other.map_err(db_err)?,
        };
        if !tables.iter().any(|t| t == "runs") || !missing_columns(&conn).map_err(db_err)?.is_empty() {
            return Err(StoreError(format!(
                "history database {}: not a current runner history, and it cannot be written here to bring it up to date; \
                 open it once as a user who may write it, or point --history (or RUNNER_HISTORY) at another file",
                path.display()
            )));
        }
        let check: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(db_err)?;
        if check != "ok" {
            return Err(explain(path, &format!("integrity check: {check}"), Some(rusqlite::ErrorCode::DatabaseCorrupt)));
        }
        Ok(Store { conn, path: path.to_path_buf() })
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        explain(&self.path, &e, sqlite_code(&e))
    }

    /// Start a run, or resume the newest unfinished one with the same kind, inputs, plugins
    /// (by name and sha256), runner version and `pieces` (what its items mean: the caller's
    /// word for the rules that computed them, which a runner of the same version number
    /// but other rules gives otherwise; the items are then already there, and pieces
    /// computed by another plugin or another runner are never reused). Returns the id and
    /// whether it resumed.
    ///
    /// # Errors
    /// A database error.
    pub fn begin(&mut self, kind: &str, command: &str, inputs: &Value, plugins: &Value, version: &str, pieces: &str) -> R<(RunId, bool)> {
        let digest = resume_key(inputs, plugins, version, pieces);
        let path = self.path.clone();
        let err = |e: rusqlite::Error| explain(&path, &e, sqlite_code(&e));
        // IMMEDIATE: take the write lock before reading, or two runners that both read
        // first would deadlock on the upgrade and one would fail "database is locked".
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(err)?;
        // An unfinished run whose process is gone (killed) is resumed; one whose process
        // still runs (a second runner with the same inputs) is left to it.
        let me = std::process::id();
        let unfinished: Vec<(RunId, u32)> = {
            let mut st = tx
                .prepare("SELECT id, owner_pid FROM runs WHERE inputs_sha256 = ?1 AND kind = ?2 AND status = 'running' ORDER BY id DESC")
                .map_err(err)?;
            let rows = st.query_map(params![digest, kind], |r| Ok((r.get(0)?, r.get(1)?))).map_err(err)?;
            rows.collect::<Result<_, _>>().map_err(err)?
        };
        let existing = unfinished.into_iter().find(|&(_, pid)| pid == me || !process_alive(pid)).map(|(id, _)| id);
        let out = match existing {
            Some(id) => {
                // The plugins are the same by sha256; where they were loaded from may not be.
                tx.execute("UPDATE runs SET owner_pid = ?2, plugins = ?3 WHERE id = ?1", params![id, me, plugins.to_string()])
                    .map_err(err)?;
                (id, true)
            }
            None => {
                tx.execute(
                    "INSERT INTO runs (kind, command, inputs, inputs_sha256, plugins, started, status, runner_version, owner_pid)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7, ?8)",
                    params![kind, command, inputs.to_string(), digest, plugins.to_string(), now(), version, me],
                )
                .map_err(err)?;
                (tx.last_insert_rowid(), false)
            }
        };
        tx.commit().map_err(err)?;
        Ok(out)
    }

    /// Record one finished item of a run (committed before this returns). Writing a key
    /// again replaces it.
    ///
    /// # Errors
    /// A database error.
    pub fn put_item(&self, run: RunId, key: &str, value: &Value) -> R<()> {
        self.conn
            .execute(
                "INSERT INTO items (run_id, seq, key, value)
                 VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM items WHERE run_id = ?1), ?2, ?3)
                 ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
                params![run, key, value.to_string()],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The items a run has written, in order.
    ///
    /// # Errors
    /// A database error or an item that is not JSON.
    pub fn items(&self, run: RunId) -> R<Vec<(String, Value)>> {
        let mut st = self.conn.prepare("SELECT key, value FROM items WHERE run_id = ?1 ORDER BY seq").map_err(|e| self.err(e))?;
        let rows = st
            .query_map(params![run], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (k, v) = row.map_err(|e| self.err(e))?;
            let value = serde_json::from_str(&v).map_err(|e| StoreError(format!("item {k} of run {run}: {e}")))?;
            out.push((k, value));
        }
        Ok(out)
    }

    /// Close a run with its result.
    ///
    /// # Errors
    /// A database error.
    pub fn finish(&self, run: RunId, status: &str, result: &Value) -> R<()> {
        self.conn
            .execute(
                "UPDATE runs SET status = ?2, finished = ?3, result = ?4 WHERE id = ?1",
                params![run, status, now(), result.to_string()],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The newest runs first.
    ///
    /// # Errors
    /// A database error.
    pub fn list(&self, limit: usize) -> R<Vec<Summary>> {
        let mut st = self
            .conn
            .prepare(
                "SELECT r.id, r.kind, r.command, r.started, r.status, (SELECT COUNT(*) FROM items i WHERE i.run_id = r.id), r.owner_pid
                 FROM runs r ORDER BY r.id DESC LIMIT ?1",
            )
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map(params![limit as i64], |r| {
                Ok(Summary {
                    id: r.get(0)?,
                    kind: r.get(1)?,
                    command: r.get(2)?,
                    started: r.get(3)?,
                    status: r.get(4)?,
                    items: r.get(5)?,
                    owner_pid: r.get(6)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// One run, whole.
    ///
    /// # Errors
    /// No run has this id (the message says which ids exist), or a database error.
    pub fn get(&self, id: RunId) -> R<Run> {
        let row = self
            .conn
            .query_row(
                "SELECT id, kind, command, started, finished, status, inputs, plugins, result, runner_version, owner_pid FROM runs WHERE id = ?1",
                params![id],
                |r| {
                    Ok((
                        r.get::<_, RunId>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, String>(5)?,
                        r.get::<_, String>(6)?,
                        r.get::<_, String>(7)?,
                        r.get::<_, Option<String>>(8)?,
                        r.get::<_, String>(9)?,
                        r.get::<_, u32>(10)?,
                    ))
                },
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let Some((id, kind, command, started, finished, status, inputs, plugins, result, runner_version, owner_pid)) = row else {
            // Say which ids exist: runs deleted from the file leave gaps, so not "1 to N".
            let (count, low, high): (i64, Option<RunId>, Option<RunId>) = self
                .conn
                .query_row("SELECT COUNT(*), MIN(id), MAX(id) FROM runs", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .map_err(|e| self.err(e))?;
            let path = self.path.display();
            return Err(StoreError(match (low, high) {
                (Some(l), Some(h)) if l == h => format!("no run {id} in {path}: it holds run {l} only (`runner history` lists it)"),
                (Some(l), Some(h)) if h - l + 1 == count => {
                    format!("no run {id} in {path}: it holds runs {l} to {h} (`runner history` lists them)")
                }
                (Some(l), Some(h)) => {
                    format!("no run {id} in {path}: it holds {count} runs, the lowest {l} and the highest {h} (`runner history` lists them)")
                }
                _ => format!("no run {id}: {path} holds no runs yet"),
            }));
        };
        let json = |what: &str, s: &str| serde_json::from_str::<Value>(s).map_err(|e| StoreError(format!("run {id} {what}: {e}")));
        Ok(Run {
            id,
            kind,
            command,
            started,
            finished,
            status,
            inputs: json("inputs", &inputs)?,
            plugins: json("plugins", &plugins)?,
            result: result.as_deref().map(|r| json("result", r)).transpose()?,
            items: self.items(id)?,
            runner_version,
            owner_pid,
        })
    }

    /// Delete the runs older than the newest `keep` (where given) or started before
    /// `before` (an RFC 3339 UTC time as [`now`] writes it, compared as text: where
    /// given), with their items, in one transaction; then VACUUM, so the file shrinks. A
    /// run whose process still runs is never deleted (it is writing). Returns the runs
    /// and items deleted.
    ///
    /// # Errors
    /// A database error (nothing is deleted then), or a failed VACUUM (the runs are gone,
    /// the file not yet smaller: the message says so).
    pub fn prune(&mut self, keep: Option<usize>, before: Option<&str>) -> R<(usize, usize)> {
        let path = self.path.clone();
        let err = |e: rusqlite::Error| explain(&path, &e, sqlite_code(&e));
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(err)?;
        let runs: Vec<(RunId, String, String, u32)> = {
            let mut st = tx.prepare("SELECT id, started, status, owner_pid FROM runs ORDER BY id DESC").map_err(err)?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).map_err(err)?;
            rows.collect::<Result<_, _>>().map_err(err)?
        };
        let doomed: Vec<RunId> = runs
            .iter()
            .enumerate()
            .filter(|(i, (_, started, _, _))| keep.is_some_and(|k| *i >= k) || before.is_some_and(|b| started.as_str() < b))
            .filter(|(_, (_, _, status, pid))| state(status, *pid) != "running")
            .map(|(_, r)| r.0)
            .collect();
        let mut items = 0;
        for id in &doomed {
            items += tx.execute("DELETE FROM items WHERE run_id = ?1", params![id]).map_err(err)?;
            tx.execute("DELETE FROM runs WHERE id = ?1", params![id]).map_err(err)?;
        }
        tx.commit().map_err(err)?;
        if !doomed.is_empty() {
            self.conn.execute_batch("VACUUM").map_err(|e| {
                StoreError(format!(
                    "{}: {} runs deleted, but the file could not be compacted (VACUUM: {e}); run `runner history` with the same \
                     flags again once no other runner writes it",
                    self.path.display(),
                    doomed.len()
                ))
            })?;
        }
        Ok((doomed.len(), items))
    }

    /// SQLite's own consistency check: "ok" when the file is sound.
    ///
    /// # Errors
    /// A database error.
    pub fn integrity(&self) -> R<String> {
        self.conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).map_err(|e| self.err(e))
    }
}

/// Whether process `pid` still runs on this machine. Where that cannot be told (not
/// Linux), an unfinished run's process is taken to be gone, so it is resumed.
fn process_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return false;
    }
    // A zombie (killed, not yet reaped by its parent) has exited: state 'Z' in stat.
    match std::fs::read_to_string(proc.join(pid.to_string()).join("stat")) {
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// One difference between two JSON values: its path, the value in A and in B.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Change {
    pub path: String,
    pub a: Value,
    pub b: Value,
}

/// Every leaf that differs between `a` and `b`, by JSON path (objects by key, arrays by
/// index, a key that holds `.`, `[`, `]` or `"`, or is empty, in brackets as a JSON
/// string, `["fp8.v2"]`; a number that differs by less than one part in 10^9 is the same). Changes come
/// in the keys' byte order at each level, depth first; a key or element missing on one
/// side reads as null there (so a missing key and a null one are the same).
pub fn diff(a: &Value, b: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    walk("", a, b, &mut out);
    out
}

fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<Change>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = match (path.is_empty(), plain_key(k)) {
                    (_, false) => format!("{path}[{}]", Value::String(k.clone())),
                    (true, true) => k.clone(),
                    (false, true) => format!("{path}.{k}"),
                };
                walk(&p, x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), out);
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                walk(&format!("{path}[{i}]"), x.get(i).unwrap_or(&Value::Null), y.get(i).unwrap_or(&Value::Null), out);
            }
        }
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
            let same = (x - y).abs() <= 1e-9 * x.abs().max(y.abs());
            if !same {
                out.push(Change { path: path.into(), a: a.clone(), b: b.clone() });
            }
        }
        _ if a != b => out.push(Change { path: path.into(), a: a.clone(), b: b.clone() }),
        _ => {}
    }
}

/// A key a path can show bare: one that cannot be read as more than one step of it.
fn plain_key(k: &str) -> bool {
    !k.is_empty() && !k.contains(['.', '[', ']', '"'])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A history path in a fresh directory of its own, its parent not yet made (the store
    /// makes it, as on a first run); the directory goes when the guard does, also when the
    /// test fails.
    fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::Builder::new().prefix(&format!("runner-store-{name}-")).tempdir().unwrap();
        let path = dir.path().join("history").join("h.sqlite");
        (dir, path)
    }

    /// Pruning deletes the runs past the newest N, or started before a date, with their
    /// items, keeps a run whose process still runs (this one's, unfinished), and the file
    /// shrinks (VACUUM). Kills: the items left behind, the keep count off by one, the date
    /// compared the other way, a running run deleted, no VACUUM.
    #[test]
    fn prune_deletes_old_runs_with_their_items_keeps_a_running_one_and_shrinks_the_file() {
        let (_guard, path) = scratch("prune");
        let mut s = Store::open(&path).unwrap();
        let big = json!("x".repeat(200_000));
        for i in 1..=5 {
            let (id, _) = s.begin("explore", "c", &json!({ "i": i }), &json!([]), "v", "").unwrap();
            s.put_item(id, "row", &big).unwrap();
            s.put_item(id, "row2", &big).unwrap();
            if i < 5 {
                s.finish(id, "done", &json!({})).unwrap();
            }
            s.conn.execute("UPDATE runs SET started = ?2 WHERE id = ?1", params![id, format!("2026-12-0{i}T10:00:00Z")]).unwrap();
        }
        // Run 5 is unfinished and its process (this one) lives: never deleted.
        s.conn.execute("UPDATE runs SET started = '2026-11-01T00:00:00Z' WHERE id = 5", []).unwrap();
        let size = |p: &Path| std::fs::metadata(p).unwrap().len() + std::fs::metadata(p.with_extension("sqlite-wal")).map_or(0, |m| m.len());
        let before = size(&path);
        assert_eq!(s.prune(None, Some("2026-12-02T10:00:00Z")).unwrap(), (1, 2), "run 1 only: run 2 started at the time itself");
        let ids = |s: &Store| s.list(10).unwrap().iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(&s), [5, 4, 3, 2]);
        assert_eq!(s.prune(Some(2), None).unwrap(), (2, 4), "runs 3 and 2, past the newest two (5 and 4)");
        assert_eq!(ids(&s), [5, 4]);
        let orphans: i64 = s.conn.query_row("SELECT COUNT(*) FROM items WHERE run_id NOT IN (SELECT id FROM runs)", [], |r| r.get(0)).unwrap();
        assert_eq!(orphans, 0);
        assert_eq!(s.prune(Some(1), Some("2027-01-01")).unwrap(), (1, 2), "4 goes; the running 5 stays");
        assert_eq!(ids(&s), [5]);
        assert_eq!(s.get(5).unwrap().items.len(), 2);
        s.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        let after = size(&path);
        assert!(after * 3 < before, "{before} bytes before, {after} after");
        assert_eq!(s.prune(Some(1), None).unwrap(), (0, 0));
    }

    /// A damaged file is refused when opened, with the way out, before any run is "kept"
    /// in it; another program's SQLite file is named as such, not with its SQL.
    #[test]
    fn a_damaged_or_foreign_database_is_refused_with_the_fix() {
        let (_dir, path) = scratch("damaged");
        let mut s = Store::open(&path).unwrap();
        for i in 0..40 {
            let (id, _) = s.begin("explore", "runner explore", &json!({ "i": i, "pad": "x".repeat(2000) }), &json!([]), "0.1.0", "").unwrap();
            s.finish(id, "done", &json!({ "rows": i })).unwrap();
        }
        drop(s);
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 5 * 4096, "{} bytes", bytes.len());
        bytes[2 * 4096..3 * 4096].fill(0xAB);
        std::fs::write(&path, bytes).unwrap();
        let e = Store::open(&path).err().expect("a damaged file is refused").to_string();
        assert!(e.contains("the file is damaged; move it aside") && e.contains(".recover"), "{e}");

        let (_dir, path) = scratch("foreign");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let c = Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE runs (name TEXT); INSERT INTO runs VALUES ('not ours');").unwrap();
        drop(c);
        let e = Store::open(&path).err().expect("a foreign database is refused").to_string();
        assert!(e.contains("not a runner history's") && !e.contains("CREATE"), "{e}");

        // Tables, none of them ours: refused and left untouched (no WAL, no tables added).
        let (_dir, path) = scratch("other-program");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let c = Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE notes (text TEXT); CREATE TABLE tags (name TEXT);").unwrap();
        drop(c);
        let e = Store::open(&path).err().expect("another program's database is refused").to_string();
        assert!(e.contains("another program's database (tables notes, tags), not a runner history"), "{e}");
        let c = Connection::open(&path).unwrap();
        let tables: i64 = c.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |r| r.get(0)).unwrap();
        let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!((tables, mode.as_str()), (2, "delete"));

        let (_dir, dir) = scratch("a-directory");
        std::fs::create_dir_all(&dir).unwrap();
        let e = Store::open(&dir).err().expect("a directory is refused").to_string();
        assert!(e.contains("is a directory; point --history (or RUNNER_HISTORY) at a file in it"), "{e}");
    }

    /// A device as the history is refused as no regular file, opened to write or to read:
    /// SQLite said "disk I/O error" of /dev/null.
    #[cfg(unix)]
    #[test]
    fn a_device_as_the_history_is_refused_as_no_file() {
        let want = "history database /dev/null: not a regular file (a device, a pipe or a socket); point --history";
        let e = Store::open(Path::new("/dev/null")).err().expect("a device is refused").to_string();
        assert!(e.starts_with(want), "{e}");
        let e = Store::open_read_only(Path::new("/dev/null")).err().expect("a device is refused").to_string();
        assert!(e.starts_with(want), "{e}");
    }

    /// A history another process keeps locked past the busy timeout is said as such,
    /// with what to do; it read "database is locked" and no more.
    #[test]
    fn a_history_locked_past_the_timeout_says_by_whom_and_what_to_do() {
        let (_dir, path) = scratch("locked");
        Store::open(&path).unwrap();
        let holder = Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let waiter = Connection::open(&path).unwrap();
        waiter.busy_timeout(Duration::ZERO).unwrap();
        let e = waiter.execute_batch("BEGIN IMMEDIATE").unwrap_err();
        let e = explain(&path, &e, sqlite_code(&e)).to_string();
        assert!(e.contains("database is locked: another process held it for over 30 s") && e.contains("give --history FILE"), "{e}");
    }

    #[test]
    fn a_run_round_trips_and_resumes_with_the_same_inputs() {
        let (_dir, path) = scratch("roundtrip");
        let mut s = Store::open(&path).unwrap();
        let inputs = json!({"model": "llama3.1-70b", "gpus": [64, 128]});
        let plugins = json!([{"name": "llama3", "sha256": "ab"}]);
        let (id, resumed) = s.begin("explore", "runner explore", &inputs, &plugins, "0.1.0", "").unwrap();
        assert!(!resumed);
        s.put_item(id, "64", &json!({"days": 115.9})).unwrap();
        drop(s);
        // Reopened with the same inputs: the unfinished run and its item are found.
        let mut s = Store::open(&path).unwrap();
        let (again, resumed) = s.begin("explore", "runner explore", &inputs, &plugins, "0.1.0", "").unwrap();
        assert_eq!((again, resumed), (id, true));
        assert_eq!(s.items(id).unwrap(), vec![("64".to_string(), json!({"days": 115.9}))]);
        // A run whose process still runs elsewhere (pid 1 here) is not resumed; once that
        // process is gone (a pid that cannot exist) it is.
        s.conn.execute("UPDATE runs SET owner_pid = 1 WHERE id = ?1", params![id]).unwrap();
        let (other, resumed) = s.begin("explore", "runner explore", &inputs, &plugins, "0.1.0", "").unwrap();
        assert!(!resumed && other != id);
        s.finish(other, "done", &json!({})).unwrap();
        s.conn.execute("UPDATE runs SET owner_pid = 4194305 WHERE id = ?1", params![id]).unwrap();
        let (again, resumed) = s.begin("explore", "runner explore", &inputs, &plugins, "0.1.0", "").unwrap();
        assert_eq!((again, resumed), (id, true));
        s.put_item(id, "128", &json!({"days": 58.0})).unwrap();
        s.finish(id, "done", &json!({"rows": 2})).unwrap();
        let r = s.get(id).unwrap();
        assert_eq!((r.status.as_str(), r.items.len(), r.result), ("done", 2, Some(json!({"rows": 2}))));
        // Finished runs are not resumed; other inputs start a new run.
        let (next, resumed) = s.begin("explore", "runner explore", &inputs, &plugins, "0.1.0", "").unwrap();
        assert!(!resumed && next != id);
        assert_eq!(s.list(10).unwrap()[0].id, next);
        assert!(s.get(999).unwrap_err().to_string().contains("no run 999"));
        assert_eq!(s.integrity().unwrap(), "ok");
    }

    /// Two writers (separate connections, as two runner processes have) at once: both
    /// runs complete with every item, and the file stays sound.
    #[test]
    fn concurrent_writers_do_not_corrupt_the_database() {
        let (_dir, path) = scratch("concurrent");
        Store::open(&path).unwrap();
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut s = Store::open(&path).unwrap();
                    let (id, _) = s.begin("sweep", "test", &json!({"writer": w}), &json!([]), "0", "").unwrap();
                    for i in 0..150 {
                        s.put_item(id, &i.to_string(), &json!({"writer": w, "i": i})).unwrap();
                    }
                    s.finish(id, "done", &json!({"items": 150})).unwrap();
                    id
                })
            })
            .collect();
        let ids: Vec<RunId> = writers.into_iter().map(|h| h.join().unwrap()).collect();
        let s = Store::open(&path).unwrap();
        for (w, id) in ids.into_iter().enumerate() {
            let r = s.get(id).unwrap();
            assert_eq!((r.status.as_str(), r.items.len()), ("done", 150));
            assert!(r.items.iter().all(|(_, v)| v["writer"] == json!(w)));
        }
        assert_eq!(s.integrity().unwrap(), "ok");
    }

    /// A history written before `owner_pid` was added (the runs table without it): opened
    /// by this runner it gains the column, its runs read back, and new runs begin and
    /// resume. It failed "no such column: owner_pid" on every run.
    #[test]
    fn a_history_from_an_older_schema_is_migrated_on_open() {
        let (_dir, path) = scratch("oldschema");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let old_schema = SCHEMA.replace(",\n    owner_pid INTEGER NOT NULL DEFAULT 0", "");
        assert!(!old_schema.contains("owner_pid") && old_schema != SCHEMA, "the older schema is the current one less owner_pid");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(&old_schema).unwrap();
            c.execute(
                "INSERT INTO runs (kind, command, inputs, inputs_sha256, plugins, started, status, runner_version)
                 VALUES ('explore', 'runner explore', '{}', 'x', '[]', '2025-01-01T00:00:00Z', 'running', '0.0.1')",
                [],
            )
            .unwrap();
        }
        let mut s = Store::open(&path).unwrap();
        let old = s.get(1).unwrap();
        assert_eq!((old.owner_pid, old.state()), (0, "interrupted"), "an old unfinished run has no live owner");
        assert_eq!(s.list(10).unwrap().len(), 1);
        let inputs = json!({"gpus": [8]});
        let (id, resumed) = s.begin("explore", "runner explore", &inputs, &json!([]), "0.1.0", "").unwrap();
        assert!(!resumed && id == 2);
        s.put_item(id, "8", &json!(1)).unwrap();
        s.finish(id, "done", &json!({})).unwrap();
        drop(s);
        // Opening it again (already migrated) changes nothing.
        let s = Store::open(&path).unwrap();
        assert_eq!(s.get(2).unwrap().items.len(), 1);
        assert_eq!(s.integrity().unwrap(), "ok");
    }

    /// An unfinished run is resumed only by a run with the same plugins (by sha256) and
    /// the same runner version: rows priced by another cost plugin are never reused. On
    /// resume the run records the plugins of the process that finishes it.
    #[test]
    fn a_run_with_other_plugins_or_another_version_does_not_resume() {
        let (_dir, path) = scratch("resumekey");
        let mut s = Store::open(&path).unwrap();
        let inputs = json!({"model": "llama3.1-8b"});
        let aws = json!([{"name": "llama3", "sha256": "aa"}, {"name": "cloud", "sha256": "11", "source": "/a/cloud.wasm"}]);
        let lambda = json!([{"name": "llama3", "sha256": "aa"}, {"name": "cloud", "sha256": "22", "source": "/a/cloud.wasm"}]);
        let interrupt = |s: &Store, id: RunId| s.conn.execute_batch(&format!("UPDATE runs SET owner_pid = 0 WHERE id = {id}")).unwrap();
        let (first, _) = s.begin("explore", "c", &inputs, &aws, "0.1.0", "").unwrap();
        interrupt(&s, first);
        let (other, resumed) = s.begin("explore", "c", &inputs, &lambda, "0.1.0", "").unwrap();
        assert!(!resumed && other != first, "another cost plugin: a fresh run");
        interrupt(&s, other);
        let (newer, resumed) = s.begin("explore", "c", &inputs, &aws, "0.2.0", "").unwrap();
        assert!(!resumed && newer != first && newer != other, "another runner version: a fresh run");
        interrupt(&s, newer);
        // The same plugins loaded from elsewhere resume, and the run records where.
        let moved = json!([{"name": "llama3", "sha256": "aa"}, {"name": "cloud", "sha256": "11", "source": "/b/cloud.wasm"}]);
        let (again, resumed) = s.begin("explore", "c", &inputs, &moved, "0.1.0", "").unwrap();
        assert_eq!((again, resumed), (first, true));
        assert_eq!(s.get(first).unwrap().plugins, moved);
        interrupt(&s, first);
        // A runner of the same version whose pieces follow other rules (an older build of
        // 0.1.0 that quoted offerings on another node) does not resume them, and its run
        // is not resumed by one of the older rules either.
        let (rules, resumed) = s.begin("explore", "c", &inputs, &aws, "0.1.0", "rows 2").unwrap();
        assert!(!resumed && rules != first, "other rules: a fresh run");
        interrupt(&s, rules);
        assert_eq!(s.begin("explore", "c", &inputs, &aws, "0.1.0", "rows 2").unwrap(), (rules, true));
        interrupt(&s, rules);
        assert_eq!(s.begin("explore", "c", &inputs, &aws, "0.1.0", "").unwrap(), (first, true));
    }

    /// A missing id is answered with the ids the file holds, gaps included; a run whose
    /// process is gone reads "interrupted", one whose process runs "running".
    #[test]
    fn a_missing_id_names_the_ids_there_and_a_dead_owner_reads_interrupted() {
        let (_dir, path) = scratch("ids");
        let mut s = Store::open(&path).unwrap();
        assert!(s.get(1).unwrap_err().to_string().contains("holds no runs yet"));
        for w in 0..4 {
            let (id, _) = s.begin("x", "t", &json!({"w": w}), &json!([]), "0", "").unwrap();
            s.finish(id, "done", &json!({})).unwrap();
        }
        let e = s.get(9).unwrap_err().to_string();
        assert!(e.contains("no run 9") && e.contains("runs 1 to 4"), "{e}");
        s.conn.execute_batch("DELETE FROM runs WHERE id IN (1, 3)").unwrap();
        let e = s.get(3).unwrap_err().to_string();
        assert!(e.contains("no run 3") && e.contains("2 runs, the lowest 2 and the highest 4") && !e.contains("1 to"), "{e}");
        s.conn.execute_batch("DELETE FROM runs WHERE id = 2").unwrap();
        assert!(s.get(1).unwrap_err().to_string().contains("holds run 4 only"));

        let (live, _) = s.begin("x", "t", &json!({"live": 1}), &json!([]), "0", "").unwrap();
        assert_eq!(s.get(live).unwrap().state(), "running", "this process owns it");
        s.conn.execute_batch(&format!("UPDATE runs SET owner_pid = 4194305 WHERE id = {live}")).unwrap();
        assert_eq!(s.get(live).unwrap().state(), "interrupted");
        assert_eq!(s.list(1).unwrap()[0].state(), "interrupted");
        assert_eq!(s.list(1).unwrap()[0].status, "running", "the stored status is left as it is");
    }

    #[test]
    fn diff_names_every_changed_leaf() {
        let a = json!({"inputs": {"gpus": [64, 128], "gpu": "H100"}, "days": 115.9, "same": 1.0});
        let b = json!({"inputs": {"gpus": [64, 256], "gpu": "H100", "tokens": 1e12}, "days": 116.0, "same": 1.0 + 1e-12});
        let d = diff(&a, &b);
        let paths: Vec<&str> = d.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, vec!["days", "inputs.gpus[1]", "inputs.tokens"]);
        assert_eq!(d[2].a, Value::Null);
    }

    /// What a hand mutation audit of this file let through, each rule at its edge: the
    /// clock's civil date (a month, the leap day, the year of January, the seconds), the
    /// default path's variables, durability (WAL, a synchronous commit), a file that is
    /// no SQLite database, and the listing's limit.
    #[test]
    fn times_paths_pragmas_and_plain_files_are_as_documented() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_798_761_599), "2026-12-31T23:59:59Z");
        assert_eq!(rfc3339_utc(1_767_225_600 + 59), "2026-01-01T00:00:59Z");
        assert_eq!(rfc3339_utc(4_107_542_400), "2100-03-01T00:00:00Z", "2100 is no leap year");

        let data = || Some(PathBuf::from("/home/a/.local/share"));
        assert_eq!(path_from(Some("/h.db".into()), data()), Some(PathBuf::from("/h.db")));
        assert_eq!(path_from(Some("/h.db".into()), None), Some(PathBuf::from("/h.db")));
        assert_eq!(path_from(None, data()), Some(PathBuf::from("/home/a/.local/share/runner/history.sqlite")));
        assert_eq!(path_from(None, None), None);
        assert_eq!(path_from(Some("".into()), data()), Some(PathBuf::from("/home/a/.local/share/runner/history.sqlite")));
        assert_eq!(path_from(Some("".into()), None), None);
        // From a relative HOME: none, not one under the working directory.
        assert_eq!(path_from(None, Some(PathBuf::from("relh/.local/share"))), None);
        assert_eq!(path_from(Some("rel.db".into()), None), Some(PathBuf::from("rel.db")));

        let (_dir, path) = scratch("pragmas");
        let s = Store::open(&path).unwrap();
        let mode: String = s.conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        let sync: i64 = s.conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
        assert_eq!((mode.as_str(), sync), ("wal", 2), "WAL, FULL (2) sync");
        let mut s = s;
        for w in 0..3 {
            let (id, _) = s.begin("x", "t", &json!({ "w": w }), &json!([]), "0", "").unwrap();
            s.finish(id, "done", &json!({})).unwrap();
        }
        assert_eq!(s.list(2).unwrap().iter().map(|r| r.id).collect::<Vec<_>>(), [3, 2]);
        let finished = s.get(1).unwrap().finished.expect("a finished run has its time");
        assert!(finished.len() == 20 && finished.ends_with('Z'), "{finished}");

        let (_dir, path) = scratch("plain-file");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "model,gpus\nllama,64\n".repeat(300)).unwrap();
        let e = Store::open(&path).err().expect("a text file is refused").to_string();
        assert!(e.contains("not an SQLite database; point --history (or RUNNER_HISTORY) at a runner history file"), "{e}");

        // Another program's database with many tables: five named, then "...".
        let (_dir, path) = scratch("six-tables");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let c = Connection::open(&path).unwrap();
        c.execute_batch(&(1..=6).map(|i| format!("CREATE TABLE t{i} (x);")).collect::<String>()).unwrap();
        drop(c);
        let e = Store::open(&path).err().unwrap().to_string();
        assert!(e.contains("(tables t1, t2, t3, t4, t5, ...)"), "{e}");
    }

    /// Items read back in the order they were first written (not by key), a key written
    /// again keeps its place; the newest of two unfinished runs is the one resumed, and
    /// it is then owned by this process; a zero value equals a zero, and an array that
    /// grew is a change.
    #[test]
    fn items_keep_their_order_and_the_newest_unfinished_run_resumes() {
        let (_dir, path) = scratch("order");
        let mut s = Store::open(&path).unwrap();
        let (id, _) = s.begin("x", "t", &json!({"k": 1}), &json!([]), "0", "").unwrap();
        for k in ["512", "1024", "64"] {
            s.put_item(id, k, &json!(k)).unwrap();
        }
        s.put_item(id, "1024", &json!("again")).unwrap();
        let keys: Vec<String> = s.items(id).unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["512", "1024", "64"]);
        assert_eq!(s.items(id).unwrap()[1].1, json!("again"));

        // Two unfinished runs of the same key, both owners gone: the newer one resumes.
        s.conn
            .execute_batch(&format!(
                "UPDATE runs SET owner_pid = 0 WHERE id = {id};
                 INSERT INTO runs (kind, command, inputs, inputs_sha256, plugins, started, status, runner_version, owner_pid)
                 SELECT kind, command, inputs, inputs_sha256, plugins, started, status, runner_version, 0 FROM runs WHERE id = {id};"
            ))
            .unwrap();
        let (again, resumed) = s.begin("x", "t", &json!({"k": 1}), &json!([]), "0", "").unwrap();
        assert_eq!((again, resumed), (id + 1, true));
        assert_eq!(s.get(again).unwrap().owner_pid, std::process::id());

        assert!(diff(&json!({"a": 0.0, "b": [0]}), &json!({"a": 0, "b": [0.0]})).is_empty());
        let d = diff(&json!({"g": [64, 128]}), &json!({"g": [64, 128, 256]}));
        assert_eq!((d.len(), d[0].path.as_str(), &d[0].b), (1, "g[2]", &json!(256)));
    }

    /// A history opened to read only: a missing path, another program's database and one
    /// from before a column was added are refused (it cannot be brought up to date
    /// without writing); a path with `?` and `#` in it opens (they would start the URI's
    /// query and fragment).
    #[test]
    fn a_history_opened_read_only_is_a_current_runner_history_at_its_own_path() {
        let guard = tempfile::Builder::new().prefix("runner-store-ro?mode=rw#x-").tempdir().unwrap();
        let path = guard.path().join("h.sqlite");
        let mut s = Store::open(&path).unwrap();
        let (id, _) = s.begin("x", "t", &json!({}), &json!([]), "0", "").unwrap();
        s.finish(id, "done", &json!({"ok": 1})).unwrap();
        drop(s);
        let r = Store::open_read_only(&path).unwrap();
        assert_eq!(r.get(id).unwrap().result, Some(json!({"ok": 1})));
        drop(r);
        drop(guard);

        let e = Store::open_read_only(&scratch("ro-missing").1).err().unwrap().to_string();
        assert!(e.ends_with(": not a file"), "{e}");
        let (_dir, path) = scratch("ro-foreign");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        Connection::open(&path).unwrap().execute_batch("CREATE TABLE notes (text TEXT);").unwrap();
        let e = Store::open_read_only(&path).err().unwrap().to_string();
        assert!(e.contains("not a current runner history"), "{e}");
        let (_dir, path) = scratch("ro-old");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        Connection::open(&path).unwrap().execute_batch(&SCHEMA.replace(",\n    owner_pid INTEGER NOT NULL DEFAULT 0", "")).unwrap();
        let e = Store::open_read_only(&path).err().unwrap().to_string();
        assert!(e.contains("not a current runner history, and it cannot be written here"), "{e}");
    }

    /// A new file another connection holds locked while it is created (no WAL yet:
    /// switching to WAL needs the file to itself, and SQLite answers "locked" at once,
    /// without its busy handler): the opening waits and retries until the lock goes.
    #[test]
    fn opening_a_new_file_locked_by_another_waits_for_it() {
        let (_dir, path) = scratch("held");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let holder = Connection::open(&path).unwrap();
        holder.execute_batch("CREATE TABLE runs_placeholder (x); DROP TABLE runs_placeholder; BEGIN EXCLUSIVE").unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            holder.execute_batch("COMMIT").unwrap();
        });
        let opened = Store::open(&path);
        release.join().unwrap();
        let mut s = opened.unwrap();
        assert!(s.begin("x", "t", &json!({}), &json!([]), "0", "").is_ok());
    }

    /// Only a run still marked running can read interrupted: a finished run's process is
    /// gone too (it exits after finishing), and the run reads as it ended, "done" or
    /// "failed", in `runner show` and in the listing alike.
    #[test]
    fn a_finished_run_whose_process_is_gone_reads_as_it_ended() {
        let (_dir, path) = scratch("ended");
        let mut s = Store::open(&path).unwrap();
        for (w, status) in ["done", "failed"].into_iter().enumerate() {
            let (id, _) = s.begin("x", "t", &json!({"w": w}), &json!([]), "0", "").unwrap();
            s.finish(id, status, &json!({})).unwrap();
            s.conn.execute_batch(&format!("UPDATE runs SET owner_pid = 4194305 WHERE id = {id}")).unwrap();
            assert_eq!(s.get(id).unwrap().state(), status);
            assert_eq!(s.list(1).unwrap()[0].state(), status);
        }
    }

    /// A listing counts each run's own items: run A wrote 3, run B 1 (a key written
    /// twice is one item), so the newest-first listing reads B 1, A 3, not the 4 items
    /// of the whole file on every line.
    #[test]
    fn a_listing_counts_each_runs_own_items() {
        let (_dir, path) = scratch("counts");
        let mut s = Store::open(&path).unwrap();
        let (a, _) = s.begin("explore", "a", &json!({"run": "a"}), &json!([]), "0", "").unwrap();
        for k in ["8", "16", "32"] {
            s.put_item(a, k, &json!(k)).unwrap();
        }
        let (b, _) = s.begin("explore", "b", &json!({"run": "b"}), &json!([]), "0", "").unwrap();
        s.put_item(b, "8", &json!(1)).unwrap();
        s.put_item(b, "8", &json!(2)).unwrap();
        let listed: Vec<(RunId, i64)> = s.list(10).unwrap().into_iter().map(|r| (r.id, r.items)).collect();
        assert_eq!(listed, [(b, 1), (a, 3)]);
    }

    /// A live owner whose command name holds ") Z" is alive: /proc/PID/stat wraps the
    /// name in parentheses, and the state is the first field after the last ')'. Read
    /// after the first one, this process would read as a zombie, and its running run be
    /// resumed by a second runner beside it.
    #[test]
    fn an_owner_named_with_a_parenthesis_is_alive() {
        let dir = tempfile::tempdir().unwrap();
        let sleep = ["/bin/sleep", "/usr/bin/sleep"].into_iter().find(|p| Path::new(p).exists()).expect("a sleep binary");
        let named = dir.path().join("a) Z b");
        std::fs::copy(sleep, &named).unwrap();
        let mut child = std::process::Command::new(&named).arg("30").spawn().unwrap();
        let comm = format!("/proc/{}/comm", child.id());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&comm).map_or(true, |c| c.trim_end() != "a) Z b") {
            assert!(std::time::Instant::now() < deadline, "the child did not start as 'a) Z b'");
            std::thread::sleep(Duration::from_millis(5));
        }
        let alive = process_alive(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(alive, "a sleeping process named 'a) Z b' is alive");
    }

    /// A process that has exited but is not yet reaped (a zombie) is gone: its run reads
    /// interrupted and resumes.
    #[test]
    fn a_zombie_owner_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let stat = format!("/proc/{}/stat", child.id());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&stat).is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z')) {
            assert!(std::time::Instant::now() < deadline, "the child did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
        if Path::new(&stat).exists() {
            assert!(!process_alive(child.id()), "a zombie is not alive");
        }
        assert!(process_alive(std::process::id()));
        child.wait().unwrap();
    }

    /// Four runners creating the same new database at once (the first run on a machine
    /// started twice): every one opens it and lands its run. Before the set-up retried,
    /// about one round in ten failed "database is locked".
    #[test]
    fn runners_creating_a_new_database_at_once_all_open_it() {
        for round in 0..40 {
            let (_dir, path) = scratch(&format!("race{round}"));
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
            let runners: Vec<_> = (0..4)
                .map(|w| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        let mut s = Store::open(&path).map_err(|e| format!("open: {e}"))?;
                        let (id, _) = s.begin("x", "t", &json!({"w": w}), &json!([]), "0", "").map_err(|e| format!("begin: {e}"))?;
                        s.put_item(id, "a", &json!(1)).map_err(|e| format!("put: {e}"))?;
                        s.finish(id, "done", &json!({})).map_err(|e| format!("finish: {e}"))
                    })
                })
                .collect();
            for r in runners {
                if let Err(e) = r.join().unwrap() {
                    panic!("round {round}: {e}");
                }
            }
            assert_eq!(Store::open(&path).unwrap().list(10).unwrap().len(), 4);
        }
    }
}

/// What `runner compare` and resuming rest on, each rule at its edge (a hand mutation audit
/// of [`diff`] and the resume key; 6 of 23 mutations survived the tests above).
#[cfg(test)]
mod compare_tests {
    use super::*;
    use serde_json::json;

    fn change(path: &str, a: Value, b: Value) -> Change {
        Change { path: path.into(), a, b }
    }

    /// A key removed, a type changed (1 -> "1"), an element added at the end of an array
    /// and one dropped from it, a key added, a leaf deep in arrays of objects: each is one
    /// change, its missing side null, in the keys' byte order at each level (GPU counts as
    /// keys read "128", "16", "8"), depth first. Swapped, the same paths with the sides
    /// swapped. Kills: removed keys not walked, added keys not walked, unsorted keys (a
    /// change twice), keys not deduplicated, the array walked to the shorter length, a
    /// type change missed.
    #[test]
    fn every_kind_of_change_is_named_once_in_key_order() {
        let a = json!({
            "gone": {"x": 1}, "kept": {"n": 1, "s": "x"}, "list": [1, 2], "short": [1, 2, 3],
            "rows": {"8": 1, "16": 2, "128": 3}, "deep": [{"y": [1, {"z": 1}]}]
        });
        let b = json!({
            "kept": {"n": "1", "s": "x"}, "list": [1, 2, 3], "new": true, "short": [1, 2],
            "rows": {"8": 2, "16": 3, "128": 4}, "deep": [{"y": [1, {"z": 2}]}]
        });
        let d = diff(&a, &b);
        assert_eq!(
            d,
            vec![
                change("deep[0].y[1].z", json!(1), json!(2)),
                change("gone", json!({"x": 1}), Value::Null),
                change("kept.n", json!(1), json!("1")),
                change("list[2]", Value::Null, json!(3)),
                change("new", Value::Null, json!(true)),
                change("rows.128", json!(3), json!(4)),
                change("rows.16", json!(2), json!(3)),
                change("rows.8", json!(1), json!(2)),
                change("short[2]", json!(3), Value::Null),
            ]
        );
        let swapped: Vec<Change> = d.iter().map(|c| change(&c.path, c.b.clone(), c.a.clone())).collect();
        assert_eq!(diff(&b, &a), swapped);
        assert!(diff(&a, &a).is_empty() && diff(&b, &b.clone()).is_empty(), "a value against itself: no change");
        // A top-level array, and a value against nothing (an unfinished run's figures).
        assert_eq!(diff(&json!([1]), &json!([2])), vec![change("[0]", json!(1), json!(2))]);
        assert_eq!(diff(&Value::Null, &json!({"x": 1})), vec![change("", Value::Null, json!({"x": 1}))]);
        // A key missing on one side reads as null there: missing and null are the same.
        assert!(diff(&json!({"a": null}), &json!({})).is_empty());
        // A key that would read as two steps is bracketed: "a.b" is not {"a": {"b"}}.
        let d = diff(
            &json!({"a.b": 1, "a": {"b": 1}, "x[0]": 1, "": 1, "q\"": 1, "H100 fp8": {"8": 1}}),
            &json!({"a.b": 2, "a": {"b": 2}, "x[0]": 2, "": 2, "q\"": 2, "H100 fp8": {"8": 2}}),
        );
        let paths: Vec<&str> = d.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, [r#"[""]"#, "H100 fp8.8", "a.b", r#"["a.b"]"#, r#"["q\""]"#, r#"["x[0]"]"#]);
    }

    /// Two numbers are the same within one part in 10^9 of the larger, however spelled
    /// (1 and 1.0, 0 and -0.0, 3 and 3.0000000001, 10^12 and 10^12 + 1); one part in two
    /// million, or 1e-12 against 2e-12, is a change. Kills: a tolerance of 10^-6, an
    /// absolute tolerance.
    #[test]
    fn numbers_are_the_same_within_one_part_in_a_billion_of_the_larger() {
        assert!(diff(&json!([1, 0, 3, 1e12, 7]), &json!([1.0, -0.0, 3.0000000001, 1e12 + 1.0, 7u64])).is_empty());
        let d = diff(&json!([1, 1e-12, 1e12]), &json!([1.0000005, 2e-12, 1.000001e12]));
        let paths: Vec<&str> = d.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["[0]", "[1]", "[2]"]);
        assert_eq!((&d[1].a, &d[1].b), (&json!(1e-12), &json!(2e-12)), "the values as given");
    }

    /// Resumed: only the newest unfinished run of the same kind, inputs (whatever their
    /// keys' order), plugins (by name and sha256) and version. Not: a finished run, a run of
    /// another kind, other inputs, a plugin of the same sha256 under another name. Kills:
    /// the kind not matched, the plugin's name left out of the resume key.
    #[test]
    fn only_an_unfinished_run_of_the_same_kind_inputs_and_plugins_resumes() {
        let dir = tempfile::Builder::new().prefix("runner-store-resume-").tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("h.sqlite")).unwrap();
        let plugins = json!([{"name": "aws", "sha256": "11"}]);
        let inputs: Value = serde_json::from_str(r#"{"gpus": [8, 16], "model": "llama3", "cloud": {"b": 1, "a": 2}}"#).unwrap();
        let (first, resumed) = s.begin("explore", "c", &inputs, &plugins, "0.1.0", "").unwrap();
        assert!(!resumed);
        let reordered: Value = serde_json::from_str(r#"{"cloud": {"a": 2, "b": 1}, "model": "llama3", "gpus": [8, 16]}"#).unwrap();
        assert_eq!(s.begin("explore", "other command", &reordered, &plugins, "0.1.0", "").unwrap(), (first, true), "keys in another order");
        assert_eq!(hash(&inputs), hash(&reordered));
        let fresh = |s: &mut Store, kind: &str, inputs: &Value, plugins: &Value| {
            let (id, resumed) = s.begin(kind, "c", inputs, plugins, "0.1.0", "").unwrap();
            assert!(!resumed && id != first, "{kind} {inputs} {plugins}: a fresh run");
            s.finish(id, "done", &json!({})).unwrap();
        };
        fresh(&mut s, "run", &inputs, &plugins);
        fresh(&mut s, "explore", &json!({"gpus": [8, 16]}), &plugins);
        fresh(&mut s, "explore", &inputs, &json!([{"name": "lambda", "sha256": "11"}]));
        s.finish(first, "done", &json!({})).unwrap();
        fresh(&mut s, "explore", &inputs, &plugins);
    }
}

/// A survivor of the second mutation audit (the `wt-mutants` branch's report): the list
/// of a foreign database's tables at its cut.
#[cfg(test)]
mod open_tests {
    use super::*;
    use rusqlite::Connection;

    fn foreign_with(tables: usize) -> String {
        let dir = tempfile::Builder::new().prefix("runner-store-foreign-").tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let c = Connection::open(&path).unwrap();
        for t in 0..tables {
            c.execute_batch(&format!("CREATE TABLE t{t} (x);")).unwrap();
        }
        drop(c);
        Store::open(&path).err().expect("another program's database is refused").to_string()
    }

    /// Another program's database names its tables, five at most, with "..." only where
    /// there are more. Kills: the ellipsis from five tables on (`>= 5`).
    #[test]
    fn a_foreign_database_names_five_tables_and_says_where_there_are_more() {
        let five = foreign_with(5);
        assert!(five.contains("(tables t0, t1, t2, t3, t4), not a runner history"), "{five}");
        let six = foreign_with(6);
        assert!(six.contains("(tables t0, t1, t2, t3, t4, ...), not a runner history"), "{six}");
    }
}
