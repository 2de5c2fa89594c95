//! What the replicated log needs from the state machine it drives.
//!
//! The raft adapter hands committed entries to a `StateMachineBackend` in log order. Commands are
//! opaque bytes here: the application encodes them, the domain decides them. An answer is opaque
//! too: bytes, or a value built on this node that the raft adapter only hands over or encodes
//! ([`Answer`]).

/// What the state machine answered for one entry.
pub enum Answer {
    /// Encoded: an answer that came from another node (a forwarded proposal), or the empty
    /// answer of an entry nobody on this node waits for.
    Bytes(Vec<u8>),
    /// As the backend built it on this node, for a proposer here: handed over as it is, so a
    /// pop's hundred messages are not encoded and decoded again on their way to the request.
    Built(Box<dyn BuiltAnswer>),
}

impl Answer {
    /// The answer's bytes (a built one encoded), for a proposer on another node.
    #[must_use]
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            Self::Bytes(b) => b,
            Self::Built(v) => v.encode(),
        }
    }

    /// The answer's bytes without taking it (borrowed when it holds them already).
    #[must_use]
    pub fn to_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            Self::Bytes(b) => std::borrow::Cow::Borrowed(b),
            Self::Built(v) => std::borrow::Cow::Owned(v.encode()),
        }
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bytes(b) => write!(f, "Answer::Bytes({} bytes)", b.len()),
            Self::Built(_) => f.write_str("Answer::Built"),
        }
    }
}

/// An answer as a backend built it: whoever proposed the entry takes its type back with
/// [`BuiltAnswer::into_any`]; a node that must send it elsewhere encodes it.
pub trait BuiltAnswer: Send + Sync + 'static {
    /// The bytes [`Answer::Bytes`] would have held.
    fn encode(&self) -> Vec<u8>;
    /// The value, for a downcast to its type.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

/// The domain's response is what the broker's backend builds.
impl BuiltAnswer for queen_domain::command::Response {
    fn encode(&self) -> Vec<u8> {
        queen_domain::command::Response::encode(self)
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// One committed log entry to apply.
#[derive(Debug, Clone)]
pub struct ApplyEntry {
    /// The entry's log index (rises by one per entry, never reissued).
    pub index: u64,
    /// The application command, or `None` for entries that carry no command (blank entries
    /// written by a new leader, membership changes). Those must still advance last-applied.
    /// Shared bytes: the log hands over the buffer it holds, without a copy.
    pub command: Option<bytes::Bytes>,
    /// Whether anyone on this node waits for the entry's response (the node that proposed it).
    /// When not, the backend answers it with an empty response and need not build one: a
    /// follower applying a pop does not encode the hundred messages it delivered to nobody.
    pub answered: bool,
    /// Where the command's bytes sit in the log's files, when the log can say (see
    /// [`LogFiles`]): a backend may keep pointing there instead of writing the bytes again.
    pub span: Option<LogSpan>,
}

/// A run of bytes in one of the replicated log's files: exactly an entry's command bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSpan {
    /// The log file (segment) number.
    pub file: u64,
    /// Byte position in the file.
    pub pos: u64,
    /// Length in bytes.
    pub len: u32,
}

/// The replicated log's files as a state machine that keeps messages inside them sees them.
///
/// The log deletes a file once every entry in it is purged, unless the state machine holds it:
/// then the file is kept (out of the log's own view) until it is released. Holds live in
/// memory; a backend states all of them again with `set_holds` after every start and snapshot
/// install, before the log can purge.
pub trait LogFiles: Send + Sync {
    /// The bytes of `span`, from the log's live files or the kept ones.
    ///
    /// # Errors
    /// The file is gone or cannot be read.
    fn read(&self, span: LogSpan) -> Result<Vec<u8>, BackendError>;

    /// Keep `file` past its purge.
    fn hold(&self, file: u64);

    /// `file` is no longer needed; a kept file that was already purged is deleted.
    ///
    /// # Errors
    /// The file could not be deleted.
    fn release(&self, file: u64) -> Result<(), BackendError>;

    /// Replace every hold by `files`; kept files not among them are deleted.
    ///
    /// # Errors
    /// A file could not be deleted.
    fn set_holds(&self, files: &[u64]) -> Result<(), BackendError>;
}

/// An error of the state machine's storage. Any error here is fatal for the node: the raft
/// adapter stops applying and reports it, because skipping an entry would make replicas diverge.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The storage engine failed (disk full, I/O error, corrupt data).
    #[error("state store failed: {0}")]
    Storage(String),
    /// A snapshot being installed was malformed.
    #[error("snapshot is malformed: {0}")]
    BadSnapshot(String),
}

/// A consistent, pinned view of the state taken at one applied point, read as framed chunks.
pub trait SnapshotChunks: Send {
    /// The metadata bytes that were stored with the view's last applied batch.
    fn meta(&self) -> Vec<u8>;
    /// The next chunk of the state (a few MiB at most), or `None` at the end.
    ///
    /// # Errors
    /// A storage failure while reading the pinned view.
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, BackendError>;

    /// A new cursor on the same pinned view, positioned at its first chunk; it yields the same
    /// chunks as this one did. Lets a reader go back without anyone keeping the chunks read so
    /// far: the view stays pinned as long as any cursor on it lives.
    ///
    /// # Errors
    /// A storage failure while opening the cursor.
    fn restart(&self) -> Result<Box<dyn SnapshotChunks>, BackendError>;
}

/// The state machine as the replicated log sees it.
///
/// Contract:
/// - `apply` is called with entries in log order, each exactly once per state (after a restart
///   the adapter resumes from the index recorded in the stored meta plus one).
/// - All effects of one `apply` call and the `meta` bytes are written in ONE atomic batch, so a
///   crash leaves either all of them or none. The write need not be fsynced (the log is durable),
///   but it must survive the process being killed (reach the OS).
/// - `apply` is deterministic: the same entries on the same state give the same state and
///   responses on every node.
pub trait StateMachineBackend: Send + Sync + 'static {
    /// Apply `entries` and store `meta` atomically with their effects. Returns one answer per
    /// entry, in order (empty bytes for an entry without command or one not `answered`).
    ///
    /// # Errors
    /// Storage failures (fatal: nothing of the batch was applied).
    fn apply(&self, entries: Vec<ApplyEntry>, meta: Vec<u8>) -> Result<Vec<Answer>, BackendError>;

    /// The meta bytes stored by the last successful `apply` or `install_snapshot`.
    ///
    /// # Errors
    /// Storage failures.
    fn load_meta(&self) -> Result<Option<Vec<u8>>, BackendError>;

    /// Make everything applied so far durable (fsync). Called before a snapshot is reported built,
    /// so the log may be purged up to it.
    ///
    /// # Errors
    /// Storage failures.
    fn persist(&self) -> Result<(), BackendError>;

    /// Pin a consistent view of the current state (including its meta) for a snapshot.
    ///
    /// # Errors
    /// Storage failures.
    fn snapshot(&self) -> Result<Box<dyn SnapshotChunks>, BackendError>;

    /// Replace the whole state with the chunks of a snapshot and store `meta` with it, atomically
    /// as seen by readers and durably (fsynced) before returning.
    ///
    /// `chunks` is read lazily, one chunk at a time (a snapshot may be larger than memory). An
    /// `Err` item means the chunks could not be read (the spooled copy failed): the install must
    /// fail with it, never treat it as the end of the snapshot.
    ///
    /// # Errors
    /// A malformed snapshot, a chunk that could not be read, or a storage failure; the old state
    /// stays in place.
    fn install_snapshot(
        &self,
        chunks: &mut dyn Iterator<Item = Result<Vec<u8>, BackendError>>,
        meta: Vec<u8>,
    ) -> Result<(), BackendError>;

    /// The log's files, handed over at every start before the first apply, so that a backend
    /// that keeps messages inside them can read them and state its holds. The default keeps
    /// nothing there.
    ///
    /// # Errors
    /// Storage failures while stating the holds.
    fn attach_log(&self, files: std::sync::Arc<dyn LogFiles>) -> Result<(), BackendError> {
        let _ = files;
        Ok(())
    }
}

/// What an applied batch changed that a waiting pop may care about, as the backend found it in
/// the batch's writes ([`ApplyObserver`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AppliedChanges {
    /// Partitions whose record was written (a push appended to them, a timer delivered into
    /// them, retention moved their start), each once.
    pub partitions: Vec<u64>,
    /// Partitions that became claimable for a group (a ready-index row was put): a lease was
    /// released or expired, a cursor moved with messages left, a push reached a group's index.
    pub ready: Vec<(u64, String)>,
}

impl AppliedChanges {
    /// Whether the batch changed nothing a waiting pop cares about.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty() && self.ready.is_empty()
    }
}

/// Told of every applied batch, on every node (leader or follower), after its writes are
/// visible to readers: the broker wakes its waiting pops from here.
pub trait ApplyObserver: Send + Sync {
    /// Whether anybody waits at all; when not, the backend does not collect the changes.
    fn wants(&self) -> bool;
    /// A batch was applied; `state` reads the state with it.
    fn applied(&self, changes: &AppliedChanges, state: &dyn queen_domain::StateRead);
}
