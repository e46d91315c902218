//! The DRA kubelet plugin services (v1 and v1beta1), served on `<plugin-dir>/dra.sock`.
//!
//! Both versions call the same [`NodeDriver`]; v1beta1 is a thin wrapper that converts to and from
//! v1 (as the Go kubeletplugin library does), so the two cannot drift apart.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::proto::{dra_v1 as v1, dra_v1beta1 as v1beta1};
use crate::prepare::{ClaimRef, NodeDriver, PrepareResult, PreparedDevice, UnprepareResult};

/// Forwards kubelet's claims to the driver and makes sure every requested claim gets an answer.
/// Calls run side by side (kubelet makes one per pod): the driver keeps operations on the same
/// claim or GPU apart itself, so a slow claim (a carve, a slow API server) delays only its pod.
struct ClaimDispatcher {
    driver: Arc<dyn NodeDriver>,
}

impl ClaimDispatcher {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, PrepareResult> {
        if claims.is_empty() {
            return HashMap::new();
        }
        tracing::debug!(claims = claims.len(), "preparing claims");
        let results = self.driver.prepare(claims.clone()).await;
        answer_every_claim(&claims, results, "prepare")
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, UnprepareResult> {
        if claims.is_empty() {
            return HashMap::new();
        }
        tracing::debug!(claims = claims.len(), "unpreparing claims");
        let results = self.driver.unprepare(claims.clone()).await;
        answer_every_claim(&claims, results, "unprepare")
    }
}

/// Keys the driver's results by claim UID. Kubelet rejects the whole response if it contains a UID
/// it did not ask for and retries every claim that has no entry, so unrequested results are dropped
/// and a missing one becomes an explicit per-claim error. An empty error text would read as
/// success to kubelet, so it is replaced too.
fn answer_every_claim<T>(
    requested: &[ClaimRef],
    results: Vec<(ClaimRef, Result<T, String>)>,
    operation: &str,
) -> HashMap<String, Result<T, String>> {
    let requested_uids: HashSet<&str> = requested.iter().map(|c| c.uid.as_str()).collect();
    let mut answers = HashMap::with_capacity(requested.len());
    for (claim, result) in results {
        if !requested_uids.contains(claim.uid.as_str()) {
            tracing::warn!(claim = %claim, claimUID = %claim.uid, operation,
                "driver returned a result for a claim kubelet did not ask for; dropped");
            continue;
        }
        let result = match result {
            Err(error) if error.is_empty() => {
                Err(format!("{operation} failed (the driver gave no reason)"))
            }
            other => other,
        };
        if let Err(error) = &result {
            tracing::warn!(claim = %claim, claimUID = %claim.uid, operation, %error,
                "claim failed");
        }
        answers.insert(claim.uid, result);
    }
    for claim in requested {
        answers.entry(claim.uid.clone()).or_insert_with(|| {
            tracing::warn!(claim = %claim, claimUID = %claim.uid, operation,
                "driver returned no result for claim");
            Err(format!(
                "driver returned no {operation} result for claim {}/{}",
                claim.namespace, claim.name
            ))
        });
    }
    answers
}

/// Kubelet matches devices to containers by the claim's request names, so a subrequest chosen
/// through `firstAvailable` (`request/subrequest`) is reported as its base request.
fn base_request_names(names: Vec<String>) -> Vec<String> {
    let mut bases: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let base = match name.split_once('/') {
            Some((base, _subrequest)) => base.to_string(),
            None => name,
        };
        if !bases.contains(&base) {
            bases.push(base);
        }
    }
    bases
}

fn claim_ref(claim: v1::Claim) -> ClaimRef {
    ClaimRef {
        namespace: claim.namespace,
        name: claim.name,
        uid: claim.uid,
    }
}

fn device_v1(device: PreparedDevice) -> v1::Device {
    v1::Device {
        request_names: base_request_names(device.request_names),
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
        share_id: device.share_id,
    }
}

fn prepare_answer_v1(result: PrepareResult) -> v1::NodePrepareResourceResponse {
    match result {
        Ok(devices) => v1::NodePrepareResourceResponse {
            devices: devices.into_iter().map(device_v1).collect(),
            error: String::new(),
        },
        Err(error) => v1::NodePrepareResourceResponse {
            devices: Vec::new(),
            error,
        },
    }
}

fn unprepare_answer_v1(result: UnprepareResult) -> v1::NodeUnprepareResourceResponse {
    v1::NodeUnprepareResourceResponse {
        error: result.err().unwrap_or_default(),
    }
}

/// `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`.
#[derive(Clone)]
pub struct DraV1Service {
    dispatcher: Arc<ClaimDispatcher>,
}

impl DraV1Service {
    pub fn new(driver: Arc<dyn NodeDriver>) -> Self {
        let dispatcher = ClaimDispatcher { driver };
        Self {
            dispatcher: Arc::new(dispatcher),
        }
    }

    async fn prepare(
        &self,
        request: v1::NodePrepareResourcesRequest,
    ) -> v1::NodePrepareResourcesResponse {
        let claims = request.claims.into_iter().map(claim_ref).collect();
        let answers = self.dispatcher.prepare(claims).await;
        v1::NodePrepareResourcesResponse {
            claims: answers
                .into_iter()
                .map(|(uid, result)| (uid, prepare_answer_v1(result)))
                .collect(),
        }
    }

    async fn unprepare(
        &self,
        request: v1::NodeUnprepareResourcesRequest,
    ) -> v1::NodeUnprepareResourcesResponse {
        let claims = request.claims.into_iter().map(claim_ref).collect();
        let answers = self.dispatcher.unprepare(claims).await;
        v1::NodeUnprepareResourcesResponse {
            claims: answers
                .into_iter()
                .map(|(uid, result)| (uid, unprepare_answer_v1(result)))
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraV1Service {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        Ok(Response::new(self.prepare(request.into_inner()).await))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(self.unprepare(request.into_inner()).await))
    }
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`: v1 without `share_id`.
#[derive(Clone)]
pub struct DraV1beta1Service {
    v1: DraV1Service,
}

impl DraV1beta1Service {
    pub fn new(v1: DraV1Service) -> Self {
        Self { v1 }
    }
}

fn claims_to_v1(claims: Vec<v1beta1::Claim>) -> Vec<v1::Claim> {
    claims
        .into_iter()
        .map(|c| v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

fn device_to_v1beta1(device: v1::Device) -> v1beta1::Device {
    v1beta1::Device {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraV1beta1Service {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = claims_to_v1(request.into_inner().claims);
        let response = self
            .v1
            .prepare(v1::NodePrepareResourcesRequest { claims })
            .await;
        let claims = response
            .claims
            .into_iter()
            .map(|(uid, answer)| {
                let devices = answer.devices.into_iter().map(device_to_v1beta1).collect();
                (
                    uid,
                    v1beta1::NodePrepareResourceResponse {
                        devices,
                        error: answer.error,
                    },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = claims_to_v1(request.into_inner().claims);
        let response = self
            .v1
            .unprepare(v1::NodeUnprepareResourcesRequest { claims })
            .await;
        let claims = response
            .claims
            .into_iter()
            .map(|(uid, answer)| {
                (
                    uid,
                    v1beta1::NodeUnprepareResourceResponse {
                        error: answer.error,
                    },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uid: &str) -> ClaimRef {
        ClaimRef::for_test(uid)
    }

    #[test]
    fn every_requested_claim_gets_an_answer_and_strangers_are_dropped() {
        let requested = [claim("a"), claim("b")];
        let results = vec![(claim("a"), Ok(())), (claim("zzz"), Ok(()))];
        let answers = answer_every_claim(&requested, results, "unprepare");
        assert_eq!(answers.len(), 2);
        assert_eq!(answers["a"], Ok(()));
        let missing = answers["b"].as_ref().unwrap_err();
        assert!(missing.contains("ns/claim-b"), "{missing}");
    }

    #[test]
    fn an_empty_error_text_still_reads_as_failure() {
        let answers = answer_every_claim(
            &[claim("a")],
            vec![(claim("a"), Err::<(), _>(String::new()))],
            "prepare",
        );
        assert!(!answers["a"].as_ref().unwrap_err().is_empty());
    }

    #[test]
    fn subrequests_are_reported_as_their_base_request() {
        let names = vec![
            "gpu/large".to_string(),
            "gpu/small".to_string(),
            "nic".to_string(),
        ];
        assert_eq!(base_request_names(names), ["gpu", "nic"]);
    }
}
