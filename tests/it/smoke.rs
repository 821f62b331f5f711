use crate::support::server::*;

#[test]
fn module_loads_and_appends() {
    let server = Server::start();
    let mut con = server.client();
    let r = map_reply(&mut con, &["MEM.APPEND", "mem:{a}", "user", "hello world"]);
    assert_eq!(int_field(&r, "id"), 1);
    let tokens = 3 + 1 + 2; // framing + "user" + "hello world" in o200k_base
    assert_eq!(int_field(&r, "tokens"), tokens);
}
