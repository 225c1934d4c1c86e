// `sqlx::migrate!()` embeds migrations/ at compile time; without this, adding a migration
// would not rebuild the crate and the binary would run the old set.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
