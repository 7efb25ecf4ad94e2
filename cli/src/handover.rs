//! `pg-elector handover NAME [--to IDENTITY]`: the library's handover request.

use std::time::Duration;

use pg_elector::{HandoverTo, LockKey, request_handover};

use crate::connect;
use crate::exit::Failure;

/// What `handover` was asked.
#[derive(Debug, clap::Args)]
pub(crate) struct HandoverArgs {
    /// The key's name, as the replicas name it (`LockKey::from_name`, or `run NAME`).
    name: String,
    /// The live standby to hand over to, by its identity as `pg_stat_activity` shows it; the
    /// most preferred live standby when not given.
    #[arg(long, value_name = "IDENTITY")]
    to: Option<String>,
    /// How long the old leader stays a standby (unless the target fails first).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    stay_away: Duration,
    /// How long to wait for the database's answer.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// Asks for the handover; prints the identity the lead goes to.
pub(crate) async fn handover(url: Option<&str>, args: HandoverArgs) -> Result<(), Failure> {
    let pool = connect::pool(url, args.timeout).await?;
    let to = args
        .to
        .map_or(HandoverTo::MostPreferred, HandoverTo::Identity);
    let key = LockKey::from_name(&args.name);
    let target = request_handover(&pool, key, to, args.stay_away, args.timeout).await?;
    println!("{}: the lead goes to {target}", args.name);
    Ok(())
}
