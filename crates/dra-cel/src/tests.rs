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
