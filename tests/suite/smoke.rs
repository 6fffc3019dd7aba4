use fleet_service as fleet;

use fleet::pb::fleet_client::FleetClient;
use fleet::{Behavior, Fleet};
use tonic_balancer::BalancedChannel;

#[tokio::test]
async fn unary_reaches_every_instance() {
    let fleet = Fleet::start(4, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 100).await;
    assert!(
        fleet.served().iter().all(|&n| n > 0),
        "{:?}",
        fleet.served()
    );
    assert_eq!(fleet::total_in_flight(&ch), 0);
}
