//! Node counts in the TUI: after the table, stale ones dropped, sync's on every screen while it runs.

use super::*;

#[test]
fn node_counts_arrive_after_the_table_and_stale_ones_are_dropped() {
    let mut m = Model::new(IdRange::for_cluster(0).unwrap(), true);
    init(&mut m);
    let mut ev = scan_event(1);
    if let Event::Scanned { scan, .. } = &mut ev {
        for i in &mut scan.items {
            i.nodes = 0;
        }
    }
    update(&mut m, Msg::Engine(ev));
    assert!(m.scan.counting, "the table shows before the counts");
    assert_eq!(item(&m, "301").nodes, 0);
    update(&mut m, Msg::Engine(counts_event(0)));
    assert!(m.scan.counting, "counts of another scan are dropped");
    update(&mut m, Msg::Engine(counts_event(1)));
    assert!(!m.scan.counting);
    assert_eq!(item(&m, "301").nodes, 4);
    assert_eq!(item(&m, "300").nodes, 0);
}

/// While sync runs, its counts (from the kvstore watch) are every screen's node counts: a
/// later scan's older read gives way to them, and once sync ends a scan's own count again.
#[test]
fn node_counts_while_sync_runs_are_syncs_on_every_screen() {
    let mut m = Model::new(IdRange::for_cluster(0).unwrap(), true);
    init(&mut m);
    update(&mut m, Msg::Engine(scan_event(1)));
    update(&mut m, Msg::Engine(counts_event(1)));
    assert_eq!(item(&m, "301").nodes, 4);
    let (masters, _) = world();
    let mut live = crate::core::kvstore::NodeCounts::default();
    live.add(&masters[1].value, &masters[1].id, 1);
    update(
        &mut m,
        Msg::Engine(Event::Sync(SyncEvent::NodeCounts(live))),
    );
    assert_eq!(item(&m, "301").nodes, 1, "the table follows sync");
    // A rescan's counts (read before the watch moved on) do not bring 4 back.
    update(&mut m, Msg::Engine(scan_event(1)));
    assert_eq!(item(&m, "301").nodes, 1);
    update(&mut m, Msg::Engine(counts_event(1)));
    assert_eq!(item(&m, "301").nodes, 1);
    // Sync over: the next scan's counts are the newest again.
    update(
        &mut m,
        Msg::Engine(Event::SyncEnded {
            end: crate::app::sync::SyncEnd::default(),
        }),
    );
    update(&mut m, Msg::Engine(counts_event(1)));
    assert_eq!(item(&m, "301").nodes, 4);
}
