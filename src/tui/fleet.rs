//! The Fleet session: the Fleet screen over several clusters, and each cluster's own
//! screens opened from it on the same terminal (Enter), until Esc brings the fleet back.
//! The clusters are read by `app::fleet`'s reader task; a cluster's engine is started by the
//! `Opener` the command hands in, so this module knows no kubeconfig, kube or etcd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossterm::event::Event as TermEvent;
use futures::StreamExt;
use futures::future::BoxFuture;
use ratatui::Terminal;
use tokio::sync::mpsc;

use super::end::TuiEnd;
use super::model::{FleetModel, Model};
use super::msg::{FleetCommand, FleetMsg};
use super::terminal::{Input, TerminalGuard, run_cluster, term_err};
use super::update::update_fleet;
use crate::app::fleet::{ClusterRef, FleetReader};
use crate::app::service::Handle;
use crate::app::signals::StopSignals;
use crate::core::range::IdRange;
use crate::error::Result;
use crate::tui::view;

/// A cluster opened from the Fleet screen: its engine, and the range it allocates in.
pub struct OpenedCluster {
    pub handle: Handle,
    pub range: IdRange,
}

/// Starts a cluster's engine (its kvstore, its API server, its decision log), or says why
/// it cannot.
pub type Opener = Arc<
    dyn Fn(ClusterRef) -> BoxFuture<'static, std::result::Result<OpenedCluster, String>>
        + Send
        + Sync,
>;

/// A cluster's screens visited from the fleet, and what they left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Visit {
    pub cluster: String,
    pub end: TuiEnd,
}

/// The Fleet session on the terminal, until the operator quits; returns every visit.
pub async fn run_fleet(
    clusters: Vec<ClusterRef>,
    reader: FleetReader,
    opener: Opener,
    no_color: bool,
) -> Result<Vec<Visit>> {
    let mut signals = StopSignals::new()?;
    let (_guard, mut terminal) = TerminalGuard::enter()?;
    let mut input = crossterm::event::EventStream::new();
    fleet_loop(
        &mut terminal,
        &mut input,
        &mut signals,
        clusters,
        reader,
        opener,
        no_color,
    )
    .await
}

/// The Fleet session over any terminal and input: one task owns both and hands them to a
/// cluster's screens while those are open.
pub async fn fleet_loop<B: ratatui::backend::Backend>(
    terminal: &mut Terminal<B>,
    input: &mut impl Input,
    signals: &mut StopSignals,
    clusters: Vec<ClusterRef>,
    mut reader: FleetReader,
    opener: Opener,
    no_color: bool,
) -> Result<Vec<Visit>>
where
    B::Error: Send + Sync + 'static,
{
    let names = clusters.iter().map(|c| c.name.clone()).collect();
    let mut model = FleetModel::new(names, no_color);
    let size = terminal.size().map_err(term_err)?;
    update_fleet(&mut model, FleetMsg::Resize { rows: size.height });
    let (opened_tx, mut opened) = mpsc::channel(1);
    let mut visits = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut pending: Vec<FleetCommand> = Vec::new();
    loop {
        for cmd in pending.drain(..) {
            match cmd {
                // Full only while a read is asked for already.
                FleetCommand::ReadAgain => {
                    let _ = reader.again.try_send(());
                }
                FleetCommand::Open(index) => {
                    let open = opener(clusters[index].clone());
                    let tx = opened_tx.clone();
                    tokio::spawn(async move {
                        let _ = tx.send((index, open.await)).await;
                    });
                }
            }
        }
        if model.quit {
            return Ok(visits);
        }
        terminal
            .draw(|f| view::draw_fleet(&model, f))
            .map_err(term_err)?;
        let msg = tokio::select! {
            ev = input.next() => match ev {
                Some(Ok(TermEvent::Key(k))) if k.kind == crossterm::event::KeyEventKind::Press => FleetMsg::Key(k),
                Some(Ok(TermEvent::Resize(_, rows))) => FleetMsg::Resize { rows },
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(term_err(e)),
                None => return Ok(visits),
            },
            Some((index, row)) = reader.rows.recv() => FleetMsg::Row { index, row: Box::new(row), now: Instant::now() },
            Some((index, result)) = opened.recv() => match result {
                Err(error) => FleetMsg::OpenFailed { index, error },
                Ok(OpenedCluster { handle, range }) => {
                    let cluster = clusters[index].name.clone();
                    let mut screens = Model::new(range, no_color);
                    screens.fleet_cluster = Some(cluster.clone());
                    let end = run_cluster(terminal, input, signals, screens, handle).await?;
                    let (back, said) = (end.back, end.said());
                    visits.push(Visit { cluster, end });
                    if !back {
                        return Ok(visits);
                    }
                    // The fleet's size may have changed while the cluster showed.
                    let size = terminal.size().map_err(term_err)?;
                    update_fleet(&mut model, FleetMsg::Resize { rows: size.height });
                    FleetMsg::Back { index, said, now: Instant::now() }
                }
            },
            _ = tick.tick() => FleetMsg::Tick { now: Instant::now() },
            _ = signals.recv() => FleetMsg::Signal,
        };
        pending = update_fleet(&mut model, msg);
    }
}
