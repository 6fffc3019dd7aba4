mod fleet;

use fleet::pb::{fleet_client::FleetClient, Req};
use fleet::{Behavior, Fleet};
use tonic_balancer::BalancedChannel;

#[tokio::test]
async fn unary_reaches_every_instance() {
    let fleet = Fleet::start(4, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    for id in 0..100 {
        let r = client
            .unary(Req {
                id,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.id, id);
    }
    assert!(
        fleet.served().iter().all(|&n| n > 0),
        "{:?}",
        fleet.served()
    );
    assert_eq!(fleet::total_in_flight(&ch), 0);
}
