//! The commit sequence of one window as a pure engine, in the style of openraft's engine: the
//! runtime asks [`WindowCommit::next`] for the action to run, runs it (a fenced KV batch, an
//! object store call), and reports what happened with [`WindowCommit::on`]. The engine does no
//! I/O and reads no clock, so the sequence and the recovery decision ([`super::commit::recover`])
//! are tested together in-process, with a crash after every action (`tests/sink_engine.rs`).
//!
//! The sequence: intent (the window's bounds fixed in KV) → a check that the commit pointer has
//! not passed the window → objects (create-only) → manifest (create-only) → commit pointer.

use super::commit::{Intent, ManifestObject, Pointer};

/// Where a window's commit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The intent is not written yet.
    Intent,
    /// After a crash: waiting until the log holds the whole window again, to rebuild it.
    Rebuild,
    /// Uploading the objects (after checking the pointer).
    Upload,
    /// Uploading the manifest.
    Manifest,
    /// Moving the pointer.
    Commit,
    /// The pointer names this window.
    Done,
}

/// What the runtime does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write the intent document (fenced KV batch); answer [`Event::IntentWritten`].
    WriteIntent(Intent),
    /// Close the window at the intent's end once every record below it is applied and read;
    /// answer [`Event::Closed`], or nothing yet (ask again later).
    CloseAt(u64),
    /// Read the commit pointer; answer [`Event::Pointer`].
    CheckPointer,
    /// Encode and upload the window's objects, create-only; answer [`Event::Uploaded`].
    Upload,
    /// Put the manifest listing [`WindowCommit::objects`], create-only; answer
    /// [`Event::ManifestPut`].
    PutManifest,
    /// Read the manifest found under the window's key; answer [`Event::ManifestFound`].
    ReadManifest,
    /// Move the commit pointer (fenced KV batch); answer [`Event::PointerMoved`].
    MovePointer(Pointer),
    /// Nothing: the window is committed.
    Nothing,
}

/// How a create-only put ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// Written now.
    Created,
    /// The same bytes were there.
    Identical,
    /// Other bytes are there.
    Different,
}

/// What happened to an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The intent is in KV.
    IntentWritten,
    /// The window's records are closed (a rebuild).
    Closed,
    /// The commit pointer's window number (0: none).
    Pointer(u64),
    /// The objects are uploaded.
    Uploaded(Vec<ManifestObject>),
    /// The manifest put ended so.
    ManifestPut(Put),
    /// The manifest under the key names this window and lists the same objects (`true`), or
    /// another window's (`false`).
    ManifestFound(bool),
    /// The pointer names this window.
    PointerMoved,
}

/// Why the engine stops the queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    /// The commit pointer already passed this window: another owner committed it while this
    /// node's lease was taken over. Nothing may be uploaded.
    #[error("the commit pointer is at window {pointer}, past window {k}")]
    Passed {
        /// This window.
        k: u64,
        /// The pointer's window.
        pointer: u64,
    },
    /// The manifest key holds another window's manifest: it is not overwritten.
    #[error("window {k}'s manifest key holds another window's manifest; refusing to overwrite it")]
    ForeignManifest {
        /// This window.
        k: u64,
    },
    /// An event that does not answer the action asked for (a bug in the runtime).
    #[error("event {event} does not answer stage {stage:?}")]
    Unexpected {
        /// The stage.
        stage: Stage,
        /// The event.
        event: &'static str,
    },
}

/// One window's commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowCommit {
    intent: Intent,
    stage: Stage,
    pointer_checked: bool,
    manifest_put: Option<Put>,
    objects: Vec<ManifestObject>,
}

impl WindowCommit {
    /// A new window whose records are closed: the intent comes first.
    #[must_use]
    pub fn new(intent: Intent) -> Self {
        Self::at(intent, Stage::Intent, Vec::new())
    }

    /// A window whose intent a crash left without a manifest (`Recovery::Redo`): rebuild the
    /// same records and upload them again.
    #[must_use]
    pub fn redo(intent: Intent) -> Self {
        Self::at(intent, Stage::Rebuild, Vec::new())
    }

    /// A window whose manifest is uploaded (`Recovery::CommitUploaded`): move the pointer.
    #[must_use]
    pub fn commit_uploaded(intent: Intent, objects: Vec<ManifestObject>) -> Self {
        Self::at(intent, Stage::Commit, objects)
    }

    fn at(intent: Intent, stage: Stage, objects: Vec<ManifestObject>) -> Self {
        Self {
            intent,
            stage,
            pointer_checked: false,
            manifest_put: None,
            objects,
        }
    }

    /// The window's intent.
    #[must_use]
    pub fn intent(&self) -> &Intent {
        &self.intent
    }

    /// Where the commit stands.
    #[must_use]
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// The uploaded objects (empty before the upload).
    #[must_use]
    pub fn objects(&self) -> &[ManifestObject] {
        &self.objects
    }

    /// The last action failed, or the run paused before its answer: the next attempt starts
    /// the stage again, so an upload checks the pointer first once more (another owner may
    /// have committed the window meanwhile) and a manifest is put again.
    pub fn interrupted(&mut self) {
        self.pointer_checked = false;
        self.manifest_put = None;
    }

    /// The action to run now.
    #[must_use]
    pub fn next(&self) -> Action {
        match self.stage {
            Stage::Intent => Action::WriteIntent(self.intent.clone()),
            Stage::Rebuild => Action::CloseAt(self.intent.t_end),
            Stage::Upload if !self.pointer_checked => Action::CheckPointer,
            Stage::Upload => Action::Upload,
            Stage::Manifest if self.manifest_put == Some(Put::Different) => Action::ReadManifest,
            Stage::Manifest => Action::PutManifest,
            Stage::Commit => Action::MovePointer(Pointer {
                k: self.intent.k,
                t_end: self.intent.t_end,
            }),
            Stage::Done => Action::Nothing,
        }
    }

    /// Take what happened to the last action.
    ///
    /// # Errors
    /// When the queue must stop: the pointer passed the window, the manifest key holds another
    /// window's manifest, or the event does not answer the action.
    pub fn on(&mut self, event: Event) -> Result<(), Stop> {
        let k = self.intent.k;
        match (self.stage, event) {
            (Stage::Intent, Event::IntentWritten) | (Stage::Rebuild, Event::Closed) => {
                self.stage = Stage::Upload;
            }
            (Stage::Upload, Event::Pointer(p)) if !self.pointer_checked => {
                if p >= k {
                    return Err(Stop::Passed { k, pointer: p });
                }
                self.pointer_checked = true;
            }
            (Stage::Upload, Event::Uploaded(objects)) if self.pointer_checked => {
                self.objects = objects;
                self.stage = Stage::Manifest;
            }
            (Stage::Manifest, Event::ManifestPut(put)) if self.manifest_put.is_none() => {
                self.manifest_put = Some(put);
                if put != Put::Different {
                    self.stage = Stage::Commit;
                }
            }
            (Stage::Manifest, Event::ManifestFound(same))
                if self.manifest_put == Some(Put::Different) =>
            {
                if !same {
                    return Err(Stop::ForeignManifest { k });
                }
                self.stage = Stage::Commit;
            }
            (Stage::Commit, Event::PointerMoved) => self.stage = Stage::Done,
            (stage, event) => {
                return Err(Stop::Unexpected {
                    stage,
                    event: event_name(&event),
                });
            }
        }
        Ok(())
    }
}

fn event_name(e: &Event) -> &'static str {
    match e {
        Event::IntentWritten => "IntentWritten",
        Event::Closed => "Closed",
        Event::Pointer(_) => "Pointer",
        Event::Uploaded(_) => "Uploaded",
        Event::ManifestPut(_) => "ManifestPut",
        Event::ManifestFound(_) => "ManifestFound",
        Event::PointerMoved => "PointerMoved",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(k: u64) -> Intent {
        Intent {
            k,
            t_start: 10,
            t_end: 20,
            writer: "w".into(),
        }
    }

    fn object() -> ManifestObject {
        ManifestObject {
            key: "o".into(),
            bytes: 1,
            records: 1,
            sha256: "x".into(),
        }
    }

    #[test]
    fn a_new_window_runs_the_whole_sequence_in_order() {
        let mut w = WindowCommit::new(intent(3));
        assert_eq!(w.next(), Action::WriteIntent(intent(3)));
        w.on(Event::IntentWritten).unwrap();
        assert_eq!(w.next(), Action::CheckPointer);
        w.on(Event::Pointer(2)).unwrap();
        assert_eq!(w.next(), Action::Upload);
        w.on(Event::Uploaded(vec![object()])).unwrap();
        assert_eq!(w.next(), Action::PutManifest);
        w.on(Event::ManifestPut(Put::Created)).unwrap();
        assert_eq!(w.next(), Action::MovePointer(Pointer { k: 3, t_end: 20 }));
        w.on(Event::PointerMoved).unwrap();
        assert_eq!((w.stage(), w.next()), (Stage::Done, Action::Nothing));
        assert_eq!(w.objects(), [object()]);
    }

    #[test]
    fn a_passed_pointer_stops_before_any_upload() {
        let mut w = WindowCommit::redo(intent(3));
        assert_eq!(w.next(), Action::CloseAt(20));
        w.on(Event::Closed).unwrap();
        assert_eq!(
            w.on(Event::Pointer(3)),
            Err(Stop::Passed { k: 3, pointer: 3 })
        );
        assert_eq!(w.next(), Action::CheckPointer, "nothing was uploaded");
    }

    #[test]
    fn a_different_manifest_is_read_back_and_only_its_twin_passes() {
        let mut w = WindowCommit::new(intent(1));
        for e in [
            Event::IntentWritten,
            Event::Pointer(0),
            Event::Uploaded(vec![object()]),
            Event::ManifestPut(Put::Different),
        ] {
            w.on(e).unwrap();
        }
        assert_eq!(w.next(), Action::ReadManifest);
        let mut other = w.clone();
        w.on(Event::ManifestFound(true)).unwrap();
        assert_eq!(w.stage(), Stage::Commit);
        assert_eq!(
            other.on(Event::ManifestFound(false)),
            Err(Stop::ForeignManifest { k: 1 })
        );
    }

    #[test]
    fn an_interrupted_upload_checks_the_pointer_again() {
        let mut w = WindowCommit::new(intent(2));
        w.on(Event::IntentWritten).unwrap();
        w.on(Event::Pointer(1)).unwrap();
        assert_eq!(w.next(), Action::Upload);
        w.interrupted();
        assert_eq!(w.next(), Action::CheckPointer);
        assert_eq!(
            w.on(Event::Pointer(2)),
            Err(Stop::Passed { k: 2, pointer: 2 })
        );
    }

    #[test]
    fn an_uploaded_window_only_moves_the_pointer() {
        let mut w = WindowCommit::commit_uploaded(intent(5), vec![object()]);
        assert_eq!(w.next(), Action::MovePointer(Pointer { k: 5, t_end: 20 }));
        assert!(matches!(
            w.on(Event::Uploaded(Vec::new())),
            Err(Stop::Unexpected { .. })
        ));
        w.on(Event::PointerMoved).unwrap();
        assert_eq!(w.stage(), Stage::Done);
    }
}
