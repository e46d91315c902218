//! End-to-end checks of the environment against outcomes observed from Kubernetes.
use super::*;
use k8s_openapi::api::resource::v1::Device;

fn device() -> DeviceView {
    let device: Device = serde_json::from_value(serde_json::json!({
        "name": "gpu-0",
        "attributes": {
            "productName": {"string": "H100"},
            "index": {"int": 3},
            "mig": {"bool": true},
            "driverVersion": {"version": "550.54.15"},
            "other.example.com/family": {"int": 7},
            "ids": {"ints": [1, 2]}
        },
        "capacity": {"memory": {"value": "80Gi"}}
    }))
    .expect("device json");
    DeviceView::new("gpu.nvidia.com", &device).expect("device view")
}

fn run(expr: &str) -> Result<bool, CelError> {
    compile(expr).and_then(|s| s.evaluate(&device()))
}

#[test]
fn memory_selector_matches() {
    assert_eq!(
        run("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"),
        Ok(true)
    );
    assert_eq!(
        run("device.attributes['gpu.nvidia.com'].productName == 'H100'"),
        Ok(true)
    );
    assert_eq!(
        run("device.attributes['other.example.com'].family == 7"),
        Ok(true)
    );
    assert_eq!(
        run("device.driver == 'gpu.nvidia.com' && !device.allowMultipleAllocations"),
        Ok(true)
    );
}

#[test]
fn missing_data_follows_kubernetes() {
    assert!(
        run("device.attributes['x'].y")
            .unwrap_err()
            .message()
            .starts_with("no such key: y. consider using")
    );
    assert_eq!(run("'x' in device.attributes"), Ok(false));
    assert_eq!(run("has(device.attributes.x)"), Ok(true));
    assert_eq!(run("device.attributes['x'].?y.orValue(1) == 1"), Ok(true));
    assert_eq!(run("device.attributes.size() == 2"), Ok(true));
}

#[test]
fn compile_errors_have_cel_go_texts() {
    let e = run("noSuchVar").unwrap_err();
    assert_eq!(e.kind(), "compile");
    assert!(
        e.message()
            .contains("undeclared reference to 'noSuchVar' (in container '')"),
        "{e}"
    );
    let e = run("1 == 1u").unwrap_err();
    assert!(
        e.message()
            .contains("found no matching overload for '_==_' applied to '(int, uint)'"),
        "{e}"
    );
    assert_eq!(
        run("1").unwrap_err().message(),
        "must evaluate to bool or the unknown type, not int"
    );
    assert!(
        run("device.foo")
            .unwrap_err()
            .message()
            .contains("undefined field 'foo'")
    );
    assert_eq!(
        run("int('x') == 1").unwrap_err().message(),
        "program instantiation failed: type conversion error from 'string' to 'int'"
    );
}

#[test]
fn runtime_errors_have_cel_go_texts() {
    let a = "device.attributes['gpu.nvidia.com']";
    assert_eq!(
        run(&format!("{a}.productName > 1")).unwrap_err().message(),
        "no such overload"
    );
    assert_eq!(
        run(&format!("{a}.index.major() == 1"))
            .unwrap_err()
            .message(),
        "no such overload: major(int)"
    );
    assert_eq!(
        run(&format!("{a}.productName.exists(x, true)"))
            .unwrap_err()
            .message(),
        "got 'types.String', expected iterable type"
    );
    assert_eq!(
        run(&format!("{a}.productName")).unwrap_err().message(),
        "CEL result of type string could not be converted to bool: unsupported native conversion from string to 'bool'"
    );
}

#[test]
fn pathological_expressions_hit_the_cost_limit() {
    let ten = "[1,2,3,4,5,6,7,8,9,10]";
    let expr = format!(
        "{ten}.all(a, {ten}.all(b, {ten}.all(c, {ten}.all(d, {ten}.all(e, {ten}.all(f, '1'.find('[0-9]*') != ''))))))"
    );
    let started = std::time::Instant::now();
    assert_eq!(run(&expr).unwrap_err().message(), eval::COST_LIMIT_MESSAGE);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn deep_nesting_is_rejected_not_overflowed() {
    let expr = format!("{}true{}", "(".repeat(5000), ")".repeat(5000));
    assert_eq!(run(&expr).unwrap_err().kind(), "compile");
    let chain = vec!["1"; 2500].join(" + ");
    assert_eq!(run(&format!("{chain} > 0")).unwrap_err().kind(), "compile");
}

/// An expression's runtime error text.
fn runtime_error(expr: &str) -> String {
    match run(expr) {
        Err(CelError::Runtime(m)) => m,
        other => panic!("{expr}: expected a runtime error, got {other:?}"),
    }
}

#[test]
fn durations_and_timestamps() {
    for expr in [
        "duration('1h2m3.5s') == duration('3723.5s')",
        "duration('-1.5h') < duration('0')",
        "string(duration('1h30m')) == '5400s'",
        "string(duration('-1ns')) == '-0.000000001s'",
        "int(duration('1s')) == 1000000000",
        "duration('25h').getHours() == 25",
        "duration('-90s').getMinutes() == -1",
        "duration('1.9999s').getMilliseconds() == 1999",
        "type(duration('1s')) == google.protobuf.Duration",
        "string(timestamp('2021-01-01T10:20:30.120+01:00')) == '2021-01-01T10:20:30.12+01:00'",
        "int(timestamp('1970-01-01T00:00:01Z')) == 1",
        "timestamp(1) == timestamp('1970-01-01T01:00:01+01:00')",
        "timestamp('2023-07-14T10:30:45.123Z').getMonth() == 6",
        "timestamp('2023-07-14T10:30:45.123Z').getMilliseconds() == 123",
        "timestamp('2023-01-01T05:30:00Z').getFullYear('-08:00') == 2022",
        "timestamp('2023-01-01T05:00:00Z').getDayOfYear('America/Los_Angeles') == 364",
        "timestamp('2023-07-01T05:00:00Z').getDayOfMonth('America/Los_Angeles') == 29",
        "timestamp('2023-07-01T05:00:00Z').getDate() == 1",
        "timestamp('2023-07-02T05:00:00Z').getDayOfWeek() == 0",
        "timestamp('2023-01-01T00:00:00Z') + duration('24h1m2s') == timestamp('2023-01-02T00:01:02Z')",
        "timestamp('2023-01-10T12:00:00Z') - timestamp('2023-01-10T00:00:00Z') == duration('12h')",
        "string(timestamp('2021-01-01T00:00:00+05:30') + duration('1h')) == '2021-01-01T01:00:00+05:30'",
        "type(timestamp(0)) == google.protobuf.Timestamp",
        "!optional.ofNonZeroValue(timestamp(-62135596800)).hasValue()",
        "[duration('2s'), duration('1s')].sum() == duration('3s')",
        "[timestamp(2), timestamp(1)].min() == timestamp(1)",
        "-dyn(duration('1s')) == duration('-1s')",
        "'%s'.format([[timestamp(0), duration('1.5s')]]) == '[timestamp(\"1970-01-01T00:00:00Z\"), duration(\"1.5s\")]'",
    ] {
        assert_eq!(run(expr), Ok(true), "{expr}");
    }
}

#[test]
fn time_errors_have_cel_go_texts() {
    let max = "duration('2562047h47m16.854775807s')";
    assert_eq!(
        runtime_error(&format!("{max} + duration('1ns') > {max}")),
        "integer overflow"
    );
    assert_eq!(
        runtime_error("timestamp('9999-12-31T23:59:59Z') + duration('1s') > timestamp(0)"),
        "timestamp overflow"
    );
    assert_eq!(
        runtime_error("timestamp(0) - timestamp('0001-01-01T00:00:00Z') > duration('0s')"),
        "integer overflow"
    );
    let a = "device.attributes['gpu.nvidia.com']";
    assert_eq!(
        runtime_error(&format!("duration({a}.productName) > duration('0s')")),
        "type conversion error from 'string' to 'google.protobuf.Duration'"
    );
    assert_eq!(
        runtime_error("timestamp(1).getHours('Mars/Olympus') == 1"),
        "unknown time zone Mars/Olympus"
    );
    assert_eq!(
        runtime_error("timestamp(1).getHours('+ab:00') == 1"),
        "strconv.Atoi: parsing \"+ab\": invalid syntax"
    );
    assert_eq!(
        runtime_error("dyn(1).getHours() == 1"),
        "no such overload: getHours(int)"
    );
    // Literal arguments are validated at compile time (cel.ValidateDurationLiterals).
    let e = run("duration('1d') > duration('0s')").unwrap_err();
    assert_eq!(e.kind(), "compile");
    assert!(e.message().contains("invalid duration argument"), "{e}");
    let e = run("timestamp(253402300800) > timestamp(0)").unwrap_err();
    assert!(e.message().contains("invalid timestamp argument"), "{e}");
    // A constant that is not a literal fails when the program is built.
    assert_eq!(
        run("duration(string(1)) > duration('0s')")
            .unwrap_err()
            .message(),
        "program instantiation failed: type conversion error from 'string' to 'google.protobuf.Duration'"
    );
    // No negation overload is declared for durations.
    assert!(
        run("-duration('1s') < duration('0s')")
            .unwrap_err()
            .message()
            .contains("found no matching overload for '-_' applied to '(duration)'")
    );
}

#[test]
fn time_zones_as_kubernetes() {
    // Values observed from the Go oracle (the zone database's history, before 1970 and after
    // 2037 included).
    for (expr, want) in [
        ("timestamp(-2000000000).getHours('America/New_York')", 15),
        ("timestamp(4000000000).getHours('America/New_York')", 3),
        ("timestamp(4100000000).getHours('Europe/Berlin')", 17),
        ("timestamp(-3000000000).getMinutes('America/New_York')", 43),
        ("timestamp(-62135596800).getMinutes('Asia/Kolkata')", 53),
        (
            "timestamp(253402300799).getMinutes('Australia/Lord_Howe')",
            59,
        ),
    ] {
        assert_eq!(
            runtime_error(&format!("[true][{expr}]")),
            format!("index out of bounds: {want}"),
            "{expr}"
        );
    }
    assert_eq!(run("timestamp(1).getHours('Local') == 0"), Ok(true));
    assert_eq!(
        runtime_error("timestamp(1).getHours('America') == 0"),
        "is a directory"
    );
    assert_eq!(
        runtime_error("timestamp(1).getHours('../x') == 0"),
        "time: invalid location name"
    );
}

#[test]
fn unknown_qualified_names_report_their_root() {
    let e = run("google.protobuf.Other == 1").unwrap_err();
    assert!(
        e.message()
            .starts_with("compilation failed: ERROR: <input>:1:1: undeclared reference to 'google' (in container '')"),
        "{e}"
    );
    let e = run("google.protobuf.Duration.x == 1").unwrap_err();
    assert!(
        e.message()
            .contains("type 'type(duration)' does not support field selection"),
        "{e}"
    );
}

#[test]
fn optional_none_has_a_free_type() {
    // cel-go declares `optional.none()` as `optional_type(V)`: its use binds V.
    let e = run("(optional.none().orValue(true)) ? (quantity('1')) : (true)").unwrap_err();
    assert!(
        e.message().contains(
            "found no matching overload for '_?_:_' applied to '(bool, kubernetes.Quantity, bool)'"
        ),
        "{e}"
    );
}

#[test]
fn timestamp_map_keys_compare_locations_as_go() {
    // Go shares fixed zones of whole hours between parses, not others; `+00:00` is Local.
    let key_in = |a: &str, b: &str| run(&format!("timestamp('{a}') in {{timestamp('{b}'): 1}}"));
    assert_eq!(
        key_in("2021-01-01T01:00:00+01:00", "2021-01-01T01:00:00+01:00"),
        Ok(true)
    );
    assert_eq!(
        key_in("2021-01-01T01:00:00+05:30", "2021-01-01T01:00:00+05:30"),
        Ok(false)
    );
    assert_eq!(
        key_in("2021-01-01T00:00:00+00:00", "2021-01-01T00:00:00Z"),
        Ok(false)
    );
    assert_eq!(
        run("cel.bind(t, timestamp('2021-01-01T01:00:00+05:30'), t in {t: 1})"),
        Ok(true)
    );
}

/// Without DRAConsumableCapacity the environment has no `allowMultipleAllocations` (Kubernetes'
/// own table: `allow_multiple_allocations_disabled`), in a selector or a presence test.
#[test]
fn multiple_allocations_need_consumable_capacity() {
    let off = Features {
        consumable_capacity: false,
    };
    for expr in [
        "device.allowMultipleAllocations == false",
        "has(device.allowMultipleAllocations)",
    ] {
        let err = compile_with(expr, off).expect_err(expr);
        assert!(
            err.message()
                .contains("undefined field 'allowMultipleAllocations'"),
            "{expr}: {err}"
        );
        assert!(
            compile(expr).is_ok(),
            "{expr} compiles with the 1.37 defaults"
        );
    }
    let cache = SelectorCache::new();
    let expr = "device.allowMultipleAllocations == false";
    assert!(cache.get_or_compile_with(expr, off).is_err());
    assert!(
        cache.get_or_compile(expr).is_ok(),
        "one entry per environment"
    );
}

/// Kubernetes' own cases for derived attributes' expressions (`TestCompileDerivedAttributes`,
/// dynamic-resource-allocation v0.37.2): (expression, list-type attributes, stored expression,
/// expected error). Stored expressions may always be lists.
#[test]
fn derived_attributes_compile_as_kubernetes_compiles_them() {
    let cases: &[(&str, bool, bool, &str)] = &[
        ("true", false, false, ""),
        ("[true, false]", true, false, ""),
        ("1", false, false, ""),
        ("[1, 2, 3]", true, false, ""),
        (r#""fish""#, false, false, ""),
        (r#"["a", "b"]"#, true, false, ""),
        (r#"semver("1.0.0")"#, false, false, ""),
        (r#"[semver("1.0.0"), semver("2.0.0")]"#, true, false, ""),
        (
            r#"device.attributes["dra.example.com"]["numa"]"#,
            false,
            false,
            "",
        ),
        (
            r#"[device.attributes["dra.example.com"]["numa"]]"#,
            true,
            false,
            "",
        ),
        (r#"dyn("foo")"#, false, false, ""),
        (r#"[dyn("foo"), dyn(1)]"#, true, false, ""),
        ("[1, 2, 3]", false, true, ""),
        (
            "device.attributes",
            false,
            false,
            "must evaluate to a primitive scalar (string, integer, boolean, semver), not map(string, map(string, google.protobuf.Any))",
        ),
        (
            "[1, 2, 3]",
            false,
            false,
            "must evaluate to a primitive scalar (string, integer, boolean, semver), not list(int)",
        ),
        (
            "[device.attributes]",
            true,
            false,
            "must evaluate to a primitive scalar (string, integer, boolean, semver) or a list of these scalars, not list(map(string, map(string, dyn)))",
        ),
        (
            "null",
            true,
            false,
            "must evaluate to a primitive scalar (string, integer, boolean, semver) or a list of these scalars, not null_type",
        ),
    ];
    for (expr, list_type, stored, error) in cases {
        let lists = *list_type || *stored;
        match compile_derived(expr, Features::default(), lists, *list_type) {
            Ok(_) => assert!(error.is_empty(), "{expr}: compiled, expected {error:?}"),
            Err(e) => assert!(
                !error.is_empty() && e.message().contains(error),
                "{expr}: {e}, expected {error:?}"
            ),
        }
    }
}

/// Kubernetes' own cases for derived attributes' values (`TestEvaluateDerivedAttributes`).
#[test]
fn derived_attributes_evaluate_as_kubernetes_evaluates_them() {
    use AttributeValue as A;
    let device: Device = serde_json::from_value(serde_json::json!({
        "name": "d",
        "attributes": {
            "bool-attr": {"bool": true},
            "int-attr": {"int": 42},
            "str-attr": {"string": "hello"},
            "ver-attr": {"version": "1.0.0"},
            "bool-list-attr": {"bools": [true, false]},
            "int-list-attr": {"ints": [1, 2, 3]},
            "str-list-attr": {"strings": ["hello", "world"]},
            "ver-list-attr": {"versions": ["1.0.0", "2.0.0"]}
        }
    }))
    .expect("device json");
    let device = DeviceView::new("driver-a", &device).expect("view");
    let attr = |name: &str| format!(r#"device.attributes["driver-a"]["{name}"]"#);
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let values: Vec<(String, AttributeValue)> = vec![
        ("true".into(), A::Bool(true)),
        ("42".into(), A::Int(42)),
        (r#""hello""#.into(), A::String("hello".into())),
        (r#"semver("1.0.0")"#.into(), A::Version("1.0.0".into())),
        (attr("bool-attr"), A::Bool(true)),
        (attr("int-attr"), A::Int(42)),
        (attr("str-attr"), A::String("hello".into())),
        (attr("ver-attr"), A::Version("1.0.0".into())),
        ("[true, false]".into(), A::Bools(vec![true, false])),
        ("[1, 2, 3]".into(), A::Ints(vec![1, 2, 3])),
        (
            r#"["hello", "world"]"#.into(),
            A::Strings(strings(&["hello", "world"])),
        ),
        (
            r#"[semver("1.0.0"), semver("2.0.0")]"#.into(),
            A::Versions(strings(&["1.0.0", "2.0.0"])),
        ),
        (attr("bool-list-attr"), A::Bools(vec![true, false])),
        (attr("int-list-attr"), A::Ints(vec![1, 2, 3])),
        (
            attr("str-list-attr"),
            A::Strings(strings(&["hello", "world"])),
        ),
        (
            attr("ver-list-attr"),
            A::Versions(strings(&["1.0.0", "2.0.0"])),
        ),
    ];
    for (expr, expected) in values {
        let selector = compile_derived(&expr, Features::default(), true, true).expect(&expr);
        assert_eq!(selector.evaluate_attribute(&device), Ok(expected), "{expr}");
    }
    let pair = |a: &str, b: &str| format!("[dyn({}), dyn({})]", attr(a), attr(b));
    let errors = [
        (
            pair("ver-attr", "str-attr"),
            "expected list element at index 1 to be semver, got string",
        ),
        (
            pair("int-attr", "str-attr"),
            "expected list element at index 1 to be int, got string",
        ),
        (
            pair("str-attr", "int-attr"),
            "expected list element at index 1 to be string, got int64",
        ),
        (attr("non-existent-attr"), "no such key"),
        (
            format!(r#"{} + "hello""#, attr("int-attr")),
            "no such overload",
        ),
        (
            "dyn(null)".into(),
            "unsupported CEL return type: structpb.NullValue",
        ),
    ];
    for (expr, error) in errors {
        let selector = compile_derived(&expr, Features::default(), true, true).expect(&expr);
        let e = selector.evaluate_attribute(&device).expect_err(&expr);
        assert!(
            e.message().contains(error),
            "{expr}: {e}, expected {error:?}"
        );
    }
}
