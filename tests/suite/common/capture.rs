//! Log capture for tests: every tracing event, with its level and fields.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_elector::LockKey;
use tracing::Dispatch;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

/// One captured event.
#[derive(Clone, Debug)]
pub struct Event {
    pub level: tracing::Level,
    pub fields: BTreeMap<String, String>,
}

impl Event {
    pub fn message(&self) -> &str {
        self.fields.get("message").map_or("", String::as_str)
    }

    pub fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }
}

/// The events seen so far.
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<Event>>>);

impl Capture {
    /// Captures the events of this thread until the guard drops (a current-thread runtime).
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    /// The events whose message starts with `message`.
    pub fn events(&self, message: &str) -> Vec<Event> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.message().starts_with(message))
            .cloned()
            .collect()
    }

    /// Waits up to `limit` for an event whose message starts with `message`; returns how long
    /// it took.
    pub async fn logged(&self, message: &str, limit: Duration) -> Option<Duration> {
        super::wait_for(limit, || !self.events(message).is_empty()).await
    }

    /// A dispatcher that records every event here and also prints `pg_elector` events to the
    /// test's output (shown when a test fails).
    pub fn dispatch(&self) -> Dispatch {
        Dispatch::new(
            tracing_subscriber::registry().with(self.clone()).with(
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_filter(tracing_subscriber::EnvFilter::new("pg_elector=debug")),
            ),
        )
    }

    /// The ERROR events about `key`.
    pub fn errors(&self, key: LockKey) -> Vec<String> {
        self.at(tracing::Level::ERROR, key)
    }

    /// The ERROR events about `key`: each message and its field `field` (empty when absent).
    pub fn errors_with(&self, key: LockKey, field: &str) -> Vec<(String, String)> {
        let key = key.to_string();
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.level == tracing::Level::ERROR)
            .filter(|e| e.fields.get("key").is_some_and(|k| *k == key))
            .map(|e| (e.message().to_owned(), e.field(field).to_owned()))
            .collect()
    }

    /// The events about `key` at `level`.
    pub fn at(&self, level: tracing::Level, key: LockKey) -> Vec<String> {
        let key = key.to_string();
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.level == level)
            .filter(|e| e.fields.get("key").is_some_and(|k| *k == key))
            .map(|e| e.message().to_owned())
            .collect()
    }
}

/// Records an event's or a span's fields into the map, by name, `Debug`-formatted but for
/// strings, which go as they are.
pub struct Visitor<'a>(pub &'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Visitor(&mut fields));
        self.0.lock().unwrap().push(Event {
            level: *event.metadata().level(),
            fields,
        });
    }
}
