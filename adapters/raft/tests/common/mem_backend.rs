//! An in-memory `StateMachineBackend` for tests: a log of applied commands plus the adapter's
//! meta bytes, with a history of states after each `apply` call to simulate a crash that lost
//! the last batches, and a check that no index is ever applied twice to the same state.

#![allow(dead_code)]

use std::sync::Mutex;

use queen_ports::Answer;
use queen_ports::ApplyEntry;
use queen_ports::BackendError;
use queen_ports::SnapshotChunks;
use queen_ports::StateMachineBackend;

/// Commands per snapshot chunk, small so tests see several chunks.
const RECORDS_PER_CHUNK: usize = 64;

/// The whole state of the in-memory backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemState {
    /// Applied commands with their log index, in apply order.
    pub applied: Vec<(u64, Vec<u8>)>,
    /// The highest index applied (with or without command).
    pub last_index: Option<u64>,
    /// The adapter's meta bytes stored with the last batch.
    pub meta: Option<Vec<u8>>,
}

/// The in-memory backend.
#[derive(Debug, Default)]
pub struct MemBackend {
    /// Everything, behind one lock (the adapter calls from blocking threads).
    inner: Mutex<Inner>,
}

/// The backend's state and counters.
#[derive(Debug, Default)]
struct Inner {
    /// The current state.
    state: MemState,
    /// State after each successful apply call.
    history: Vec<MemState>,
    /// Number of apply calls.
    apply_calls: u64,
    /// Number of persist calls.
    persists: u64,
    /// Number of snapshot installs.
    installs: u64,
}

/// The response the backend gives for a command: "ok:" followed by the command.
pub fn response_for(command: &[u8]) -> Vec<u8> {
    let mut r = b"ok:".to_vec();
    r.extend_from_slice(command);
    r
}

impl MemBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend restored to `state`, as if the process restarted with it on disk.
    pub fn from_state(state: MemState) -> Self {
        Self {
            inner: Mutex::new(Inner {
                state,
                ..Default::default()
            }),
        }
    }

    /// The current state.
    pub fn state(&self) -> MemState {
        self.inner.lock().expect("mem backend lock").state.clone()
    }

    /// States after each apply call, oldest first.
    pub fn history(&self) -> Vec<MemState> {
        self.inner.lock().expect("mem backend lock").history.clone()
    }

    /// Number of apply calls so far.
    pub fn apply_calls(&self) -> u64 {
        self.inner.lock().expect("mem backend lock").apply_calls
    }

    /// Number of persist calls so far.
    pub fn persists(&self) -> u64 {
        self.inner.lock().expect("mem backend lock").persists
    }

    /// Number of snapshot installs so far.
    pub fn installs(&self) -> u64 {
        self.inner.lock().expect("mem backend lock").installs
    }
}

impl StateMachineBackend for MemBackend {
    fn apply(&self, entries: Vec<ApplyEntry>, meta: Vec<u8>) -> Result<Vec<Answer>, BackendError> {
        let mut inner = self.inner.lock().expect("mem backend lock");
        let mut next = inner.state.clone();
        let mut responses = Vec::with_capacity(entries.len());
        for e in entries {
            if next.last_index.is_some_and(|l| e.index <= l) {
                return Err(BackendError::Storage(format!(
                    "index {} applied twice (last applied {:?})",
                    e.index, next.last_index
                )));
            }
            next.last_index = Some(e.index);
            match e.command {
                Some(c) => {
                    responses.push(Answer::Bytes(response_for(&c)));
                    next.applied.push((e.index, c.to_vec()));
                }
                None => responses.push(Answer::Bytes(Vec::new())),
            }
        }
        next.meta = Some(meta);
        inner.state = next.clone();
        inner.history.push(next);
        inner.apply_calls += 1;
        Ok(responses)
    }

    fn load_meta(&self) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self
            .inner
            .lock()
            .expect("mem backend lock")
            .state
            .meta
            .clone())
    }

    fn persist(&self) -> Result<(), BackendError> {
        self.inner.lock().expect("mem backend lock").persists += 1;
        Ok(())
    }

    fn snapshot(&self) -> Result<Box<dyn SnapshotChunks>, BackendError> {
        let state = self.state();
        Ok(Box::new(MemChunks {
            meta: state.meta.clone().unwrap_or_default(),
            last_index: state.last_index,
            records: state.applied,
            pos: 0,
            header_sent: false,
        }))
    }

    fn install_snapshot(
        &self,
        chunks: &mut dyn Iterator<Item = Result<Vec<u8>, BackendError>>,
        meta: Vec<u8>,
    ) -> Result<(), BackendError> {
        let mut state = MemState {
            meta: Some(meta),
            ..Default::default()
        };
        let mut first = true;
        for chunk in chunks {
            let chunk = chunk?;
            if first {
                state.last_index = decode_header(&chunk)?;
                first = false;
                continue;
            }
            decode_records(&chunk, &mut state.applied)?;
        }
        if first {
            return Err(BackendError::BadSnapshot("no header chunk".into()));
        }
        let mut inner = self.inner.lock().expect("mem backend lock");
        inner.state = state;
        inner.installs += 1;
        Ok(())
    }
}

/// A snapshot view: one header chunk with the last index, then chunks of records.
#[derive(Clone)]
struct MemChunks {
    /// The meta bytes of the pinned state.
    meta: Vec<u8>,
    /// The pinned state's last applied index.
    last_index: Option<u64>,
    /// The pinned state's commands.
    records: Vec<(u64, Vec<u8>)>,
    /// Next record to send.
    pos: usize,
    /// Whether the header chunk went out.
    header_sent: bool,
}

impl SnapshotChunks for MemChunks {
    fn meta(&self) -> Vec<u8> {
        self.meta.clone()
    }

    fn restart(&self) -> Result<Box<dyn SnapshotChunks>, BackendError> {
        Ok(Box::new(MemChunks {
            pos: 0,
            header_sent: false,
            ..self.clone()
        }))
    }

    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, BackendError> {
        if !self.header_sent {
            self.header_sent = true;
            let mut h = vec![u8::from(self.last_index.is_some())];
            h.extend_from_slice(&self.last_index.unwrap_or(0).to_le_bytes());
            return Ok(Some(h));
        }
        if self.pos >= self.records.len() {
            return Ok(None);
        }
        let end = (self.pos + RECORDS_PER_CHUNK).min(self.records.len());
        let mut out = Vec::new();
        for (index, cmd) in &self.records[self.pos..end] {
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(&(cmd.len() as u32).to_le_bytes());
            out.extend_from_slice(cmd);
        }
        self.pos = end;
        Ok(Some(out))
    }
}

fn decode_header(chunk: &[u8]) -> Result<Option<u64>, BackendError> {
    if chunk.len() != 9 {
        return Err(BackendError::BadSnapshot("bad header chunk".into()));
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&chunk[1..9]);
    Ok((chunk[0] == 1).then_some(u64::from_le_bytes(b)))
}

fn decode_records(mut chunk: &[u8], out: &mut Vec<(u64, Vec<u8>)>) -> Result<(), BackendError> {
    let bad = || BackendError::BadSnapshot("truncated record chunk".into());
    while !chunk.is_empty() {
        if chunk.len() < 12 {
            return Err(bad());
        }
        let mut idx = [0u8; 8];
        idx.copy_from_slice(&chunk[..8]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&chunk[8..12]);
        let len = u32::from_le_bytes(len) as usize;
        if chunk.len() < 12 + len {
            return Err(bad());
        }
        out.push((u64::from_le_bytes(idx), chunk[12..12 + len].to_vec()));
        chunk = &chunk[12 + len..];
    }
    Ok(())
}
