//! Events on this node's Node object: device health changes and the refusal to act on the node.

/// An event about this node.
pub(super) struct NodeEvent<'a> {
    pub(super) warning: bool,
    pub(super) reason: &'static str,
    pub(super) action: &'static str,
    pub(super) note: &'a str,
}

/// An event on this node's Node object (`kubectl describe node` shows it).
pub(super) async fn report_on_node(
    client: &kube::Client,
    node_name: &str,
    driver_name: &str,
    event: NodeEvent<'_>,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: driver_name.to_string(),
            instance: Some(node_name.to_string()),
        },
    );
    let node = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node_name.to_string()),
        ..Default::default()
    };
    recorder
        .publish(
            &Event {
                type_: if event.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: event.reason.into(),
                note: Some(event.note.chars().take(1024).collect()),
                action: event.action.into(),
                secondary: None,
            },
            &node,
        )
        .await
}
