//! KubeEdge's devicecontroller, as the messages it exchanges with a node's
//! devicetwin: the twin sync answered on connect and the membership
//! updates between syncs ([`twin_sync`]), and the device reports taken into
//! a Device's status ([`twin_reports`]). They are plain functions; the
//! edgecontroller decides which devices a node holds (its reconciler) and
//! calls them, so this folder uses nothing of the edgecontroller's.

pub mod twin_reports;
pub mod twin_sync;
