//! API types edgehive carries that k8s-openapi does not have: KubeEdge's
//! device CRDs (`devices.kubeedge.io/v1beta1` `Device` and `DeviceModel`),
//! written from KubeEdge's public API definitions. They implement
//! k8s-openapi's `Resource` traits, so lists and watch events of them are
//! built the way the core kinds' are.

pub mod devices;
