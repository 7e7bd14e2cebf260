//! A small OTLP gRPC trace receiver run by a test, in place of a collector: it keeps every span
//! it receives with its resource's service attributes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;

use super::{Site, poll};

/// OTLP's span kinds.
pub const SERVER: i32 = 2;
pub const CLIENT: i32 = 3;

/// How long spans may take to arrive on a loaded machine (the export interval is 100 ms).
pub const SPANS_WAIT: Duration = Duration::from_secs(30);

/// One span as the receiver got it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service: String,
    /// The resource's `service.version` and `service.instance.id`.
    pub version: String,
    pub instance: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    /// OTLP's span kind: 2 server, 3 client.
    pub kind: i32,
    pub name: String,
    pub request_id: Option<String>,
}

#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let resource = |key: &str| {
                resource_spans
                    .resource
                    .iter()
                    .flat_map(|resource| &resource.attributes)
                    .find(|attribute| attribute.key == key)
                    .and_then(|attribute| string_of(attribute.value.as_ref()?.value.as_ref()?))
                    .unwrap_or_default()
            };
            let (service, version, instance) = (
                resource("service.name"),
                resource("service.version"),
                resource("service.instance.id"),
            );
            for span in resource_spans
                .scope_spans
                .into_iter()
                .flat_map(|scope| scope.spans)
            {
                let request_id = span
                    .attributes
                    .iter()
                    .find(|attribute| attribute.key == "hivenet.request_id")
                    .and_then(|attribute| string_of(attribute.value.as_ref()?.value.as_ref()?));
                received.push(ReceivedSpan {
                    service: service.clone(),
                    version: version.clone(),
                    instance: instance.clone(),
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    kind: span.kind,
                    name: span.name,
                    request_id,
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn string_of(value: &AnyValue) -> Option<String> {
    match value {
        AnyValue::StringValue(text) => Some(text.clone()),
        _ => None,
    }
}

/// Starts the receiver on a free loopback port on its own runtime thread; returns its endpoint
/// (`127.0.0.1:<port>`, no scheme, as the reference writes it) and what it received.
pub fn start_receiver() -> (String, Arc<Mutex<Vec<ReceivedSpan>>>) {
    start_receiver_with(None)
}

/// As [`start_receiver`], serving TLS with `identity` when given.
pub fn start_receiver_with(
    identity: Option<tonic::transport::Identity>,
) -> (String, Arc<Mutex<Vec<ReceivedSpan>>>) {
    let receiver = Receiver::default();
    let spans = receiver.spans.clone();
    let (bound, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let incoming =
                tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap())
                    .unwrap();
            bound.send(incoming.local_addr().unwrap()).unwrap();
            let mut server = tonic::transport::Server::builder();
            if let Some(identity) = identity {
                server = server
                    .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                    .unwrap();
            }
            server
                .add_service(TraceServiceServer::new(receiver))
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
    });
    let address = address.recv().unwrap();
    (address.to_string(), spans)
}

/// Waits until a span of `service` in `trace_id` has arrived.
pub fn wait_span(spans: &Mutex<Vec<ReceivedSpan>>, trace_id: &str, service: &str, site: &Site) {
    poll(SPANS_WAIT, || {
        let spans = spans.lock().unwrap();
        spans
            .iter()
            .any(|span| span.trace_id == trace_id && span.service == service)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("no {service} span of {trace_id}\n{}", site.logs()));
}
