//! Property tests of the CEL pipeline: for random token soup and for structured expressions
//! over random devices, compiling and evaluating never panics, never overflows the stack and
//! answers within a bounded time; pathological expressions stop at the cost limit.
use std::time::{Duration, Instant};

use dra_cel::{CelError, DeviceView, compile};
use k8s_openapi::api::resource::v1::Device;
use proptest::prelude::*;
use serde_json::json;

/// Generous for debug builds; the cost limit keeps real work far below it.
const MAX_EVAL: Duration = Duration::from_secs(3);

fn device_view(driver: &str, index: i64, name: &str, memory: &str, ids: &[i64]) -> DeviceView {
    let device: Device = serde_json::from_value(json!({
        "name": "gpu-0",
        "attributes": {
            "productName": {"string": name},
            "index": {"int": index},
            "driverVersion": {"version": "550.54.15"},
            "ids": {"ints": ids},
        },
        "capacity": {"memory": {"value": memory}},
    }))
    .expect("device json");
    DeviceView::new(driver, &device).expect("device view")
}

/// Compiles and evaluates; a panic inside would fail the test, and so does a slow answer or
/// the compiler thread reporting a panic.
fn exercise(expr: &str, device: &DeviceView) {
    let start = Instant::now();
    let result = compile(expr).and_then(|s| s.evaluate(device));
    let took = start.elapsed();
    assert!(took < MAX_EVAL, "{expr:?} took {took:?}");
    if let Err(e) = &result {
        assert!(
            !e.message().contains("internal error"),
            "{expr:?}: {}",
            e.message()
        );
    }
}

const TOKENS: &[&str] = &[
    "device",
    ".",
    "attributes",
    "capacity",
    "driver",
    "[",
    "]",
    "(",
    ")",
    "{",
    "}",
    ",",
    ":",
    "'gpu.nvidia.com'",
    "'x'",
    "\"",
    "'",
    "1",
    "-1",
    "0u",
    "1.5",
    "true",
    "null",
    "==",
    "!=",
    "<",
    ">=",
    "&&",
    "||",
    "!",
    "?",
    "+",
    "-",
    "*",
    "/",
    "%",
    "in",
    "exists",
    "all",
    "map",
    "filter",
    "x",
    "y",
    "size",
    "has",
    "quantity",
    "semver",
    "cidr",
    "ip",
    "format",
    "dns1123Label",
    "validate",
    "matches",
    "find",
    "'[0-9]+'",
    "lists",
    "range",
    "cel",
    "bind",
    "optional",
    "of",
    "orValue",
    ".?",
    "[?",
    "sets",
    "contains",
    "transformMapEntry",
    "productName",
    "index",
    "memory",
    "compareTo",
    "'40Gi'",
    "'10.0.0.0/8'",
    " ",
    "\n",
    "\\",
    "`",
    "#",
    "@",
    "é",
    "🚀",
];

fn token_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..40).prop_map(|t| t.concat())
}

/// Structured expressions: well-formed CEL built from the DRA vocabulary, nested.
fn structured() -> impl Strategy<Value = String> {
    let attr = "device.attributes['gpu.nvidia.com']";
    let cap = "device.capacity['gpu.nvidia.com']";
    let leaf = prop_oneof![
        (-3i64..10).prop_map(move |i| format!("{attr}.index > {i}")),
        "[a-zA-Z0-9 .-]{0,12}".prop_map(move |s| format!("{attr}.productName == '{s}'")),
        "[a-z0-9.]{0,8}".prop_map(move |s| format!("{attr}.productName.matches('{s}')")),
        "[0-9]{1,4}(Gi|Mi|k|m|)"
            .prop_map(move |q| format!("{cap}.memory.compareTo(quantity('{q}')) >= 0")),
        (0u8..=255, 0u8..=32)
            .prop_map(|(a, b)| format!("cidr('10.{a}.0.0/{b}').containsIP('10.{a}.1.2')")),
        "[a-z0-9.-]{0,10}"
            .prop_map(|s| format!("format.dns1123Label().validate('{s}').hasValue()")),
        (0i64..6).prop_map(move |n| format!("{attr}.ids.exists(x, x == {n})")),
        Just(format!("{attr}.?missing.orValue(1) == 1")),
        Just(format!("has({attr}.index)")),
        Just("device.driver.startsWith('gpu')".to_string()),
        Just(format!("{attr}.ids.transformList(i, v, v * i).size() >= 0")),
    ];
    leaf.prop_recursive(6, 64, 3, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) && ({b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) || ({b})")),
            inner.clone().prop_map(|a| format!("!({a})")),
            (inner.clone(), inner.clone(), inner.clone())
                .prop_map(|(a, b, c)| format!("({a}) ? ({b}) : ({c})")),
            inner
                .clone()
                .prop_map(|a| format!("cel.bind(v, 1, [1, 2, 3].all(x, ({a}) || x > v))")),
        ]
    })
}

fn devices() -> impl Strategy<Value = DeviceView> {
    (
        prop::sample::select(&["gpu.nvidia.com", "other.example.com"][..]),
        -2i64..8,
        "[A-Za-z0-9 ]{0,10}",
        prop::sample::select(&["80Gi", "1", "0.5", "1e3", "123456789012345678901"][..]),
        prop::collection::vec(0i64..5, 0..4),
    )
        .prop_map(|(driver, index, name, memory, ids)| {
            device_view(driver, index, &name, memory, &ids)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn token_soup_never_panics(expr in token_soup(), device in devices()) {
        exercise(&expr, &device);
    }

    #[test]
    fn structured_expressions_never_panic(expr in structured(), device in devices()) {
        exercise(&expr, &device);
    }

    #[test]
    fn arbitrary_unicode_never_panics(expr in "\\PC{0,60}", device in devices()) {
        exercise(&expr, &device);
    }
}

#[test]
fn deep_nesting_is_rejected_not_overflowed() {
    let device = device_view("gpu.nvidia.com", 1, "H100", "80Gi", &[1]);
    for expr in [
        format!("{}true{}", "(".repeat(5000), ")".repeat(5000)),
        format!("{}1 == 1", "1 + ".repeat(3000)),
        format!("{}true", "!".repeat(5000)),
        format!("{}1{}", "[".repeat(3000), "]".repeat(3000)),
        format!("device{}", ".attributes".repeat(3000)),
        format!("{}0]", "[0, ".repeat(3000)),
    ] {
        let expr = &expr[..expr.len().min(10 * 1024)];
        exercise(expr, &device);
    }
}

#[test]
fn pathological_expressions_stop_at_the_cost_limit() {
    let device = device_view("gpu.nvidia.com", 1, "H100", "80Gi", &[1, 2, 3]);
    for expr in [
        "lists.range(1000).all(a, lists.range(1000).all(b, lists.range(1000).all(c, true)))",
        "lists.range(1000).map(a, lists.range(1000).map(b, a + b)).size() > 0",
        "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, [1,2,3,4,5,6,7,8,9,10].all(f, '1'.find('[0-9]*') == '1'))))))",
        "lists.range(5000).map(x, 'abcdefghij').join('').size() > 0 && lists.range(5000).exists(x, lists.range(5000).exists(y, y < 0))",
    ] {
        let start = Instant::now();
        let result = compile(expr).and_then(|s| s.evaluate(&device));
        assert!(
            start.elapsed() < MAX_EVAL,
            "{expr} took {:?}",
            start.elapsed()
        );
        match result {
            Err(CelError::Runtime(m)) => {
                assert!(m.contains("actual cost limit exceeded"), "{expr}: {m}")
            }
            other => panic!("{expr}: expected the cost limit, got {other:?}"),
        }
    }
}
