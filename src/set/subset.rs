//! Subsetting: each client connects to a few of the instances, chosen so that every instance
//! gets about the same number of clients and a membership change moves at most about one
//! instance in a client's subset ([`Builder::subset`](crate::Builder::subset)). gRPC's design
//! of it: [A68](https://github.com/grpc/proposal/blob/master/A68-random-subsetting.md).
//!
//! # The algorithm: deterministic aperture on a ring
//!
//! Every client orders the instances the same way: by a stable 64-bit hash of each instance's
//! address (the same on every client, in every process and release of this crate; ties by
//! address). In that order they form a ring of `n` slots. Client `index` of `count` takes the
//! `size` consecutive instances starting at slot `⌊index × n / count⌋`, wrapping around.
//!
//! - **Balance.** The clients' starting slots are spread evenly over the ring, so the number of
//!   clients whose window covers a given instance is the number of multiples of `n / count`
//!   in a window of `size` slots: `⌊count × size / n⌋` or one more, for every instance. With 100
//!   clients, 1,000 instances and subsets of 50, every instance has exactly 5 clients.
//! - **Stability.** When one instance leaves (or joins), the ring loses (or gains) one slot and
//!   each client's starting slot moves by less than one slot: a window that does not hold the
//!   instance that left shifts by at most one place (one instance out, the next one in), a
//!   window that held it takes the next one instead. A client's subset changes by one instance
//!   or none (two for some windows that wrap past the end of the ring). On average, over the
//!   clients and over which instance leaves, that is about half a member per client for small
//!   subsets and under one for subsets of up to half the set (larger ones, which save little,
//!   move up to about one and a half). The property tests in this file and
//!   `examples/scale.rs` measure both.
//!
//! This is Finagle's deterministic aperture (clients and instances on one ring, each client's
//! aperture a contiguous arc), with whole instances rather than fractional ones, so that a
//! client connects to exactly `size` instances.
//!
//! # Why not rendezvous hashing
//!
//! gRPC's A68 (`random_subsetting`) keeps the `size` instances with the highest hash under a
//! random per-client seed. It needs no coordination and changes only the clients that held the
//! instance, but each instance's number of clients is then random (binomial): with 100
//! clients, 1,000 instances and subsets of 50 it averages 5 and the busiest instance has two
//! or more times that (`examples/scale.rs` prints the figure), far from the 1.2× max/mean we
//! aim at. A68 itself says its distribution is close to uniform only when
//! `clients × size / instances` is high. The price of the deterministic scheme is that each
//! client needs its index and the number of clients
//! ([`Builder::subset_client`](crate::Builder::subset_client)): a StatefulSet's ordinal, a
//! shard number, a worker id.
//! A client without one can pass a random index of a large count; the balance is then random,
//! as with rendezvous hashing, while a membership change still moves about one instance.
//!
//! # What the channel does with the subset
//!
//! The subset sits between the full member list (the builder's instances, discovery's
//! answers, [`insert`](crate::BalancedChannel::insert), [`remove`](crate::BalancedChannel::remove),
//! [`replace_all`](crate::BalancedChannel::replace_all)) and the instances the channel keeps:
//! every change of the list recomputes the subset, and only the instances in it exist as
//! instances of the channel (with a connection, health checks, stats). An instance that leaves
//! the subset drains as a removed one does (its calls finish); one that enters it is added.
//! The pick scans the subset only. What `insert`, `remove` and `replace_all` return is about
//! the full list (whether the URI was in it; how many of the list were added and removed),
//! since that is the list their caller gives.
//!
//! When every instance of the subset is failing, the subset stays the only set: calls fail
//! with UNAVAILABLE as they would with any set whose instances all fail, rather than spilling
//! over to the other instances. A fallback to the full list would open a connection from
//! every client to every instance at the moment the fleet is in trouble, the storm subsetting
//! exists to prevent; and a subset of a sensible size (tens of instances) all failing at once
//! means the whole service is failing. Instances that are gone for good leave the subset when
//! discovery (or the application) removes them, and the next ones on the ring take their
//! place.

use std::collections::{HashMap, HashSet};

use super::{Joining, Reuse, Set};
use crate::error::Error;
use crate::target::{Key, Target};

/// The subsetting of a channel (its aperture), checked: how many instances each client keeps,
/// and this client's place among the clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Aperture {
    pub(crate) size: usize,
    pub(crate) index: usize,
    pub(crate) count: usize,
}

impl Aperture {
    /// Checks what the builder was given: a size and this client's place among the clients.
    pub(crate) fn new(
        size: Option<usize>,
        client: Option<(usize, usize)>,
    ) -> Result<Option<Aperture>, Error> {
        let invalid = |name, reason: String| Err(Error::InvalidSetting { name, reason });
        match (size, client) {
            (None, None) => Ok(None),
            (None, Some(_)) => invalid(
                "subset",
                "subset_client was given without subset(size)".to_owned(),
            ),
            (Some(0), _) => invalid("subset", "the size must be at least 1".to_owned()),
            (Some(_), None) => invalid(
                "subset_client",
                "subsetting needs this client's index and the number of clients \
                 (Builder::subset_client)"
                    .to_owned(),
            ),
            (Some(_), Some((_, 0))) => invalid(
                "subset_client",
                "the number of clients must be at least 1".to_owned(),
            ),
            (Some(_), Some((index, count))) if index >= count => invalid(
                "subset_client",
                format!("the index {index} must be below the number of clients {count}"),
            ),
            (Some(size), Some((index, count))) => Ok(Some(Aperture { size, index, count })),
        }
    }

    /// The members of this client's subset among `all`.
    pub(crate) fn choose<'a>(&self, all: &'a [Target]) -> Vec<&'a Target> {
        let ids: Vec<(u64, &str)> = all.iter().map(|t| (id(&t.key), &*t.name)).collect();
        choose_by(&ids, self.size, self.index, self.count)
            .into_iter()
            .map(|i| &all[i])
            .collect()
    }
}

/// The subset's state in a set: the settings and the full member list the subset is drawn
/// from.
pub(crate) struct Subset {
    pub(crate) settings: Aperture,
    pub(crate) all: std::sync::Mutex<Vec<Target>>,
}

impl Subset {
    pub(crate) fn new(settings: Aperture) -> Subset {
        Subset {
            settings,
            all: std::sync::Mutex::new(Vec::new()),
        }
    }
}

/// Applies `edit` to the full member list, then brings the set's instances in line with the
/// new subset, as one membership change (one snapshot): the members that left the subset
/// drain, the new ones join (with a connection from `connected` if there is one), and the
/// instance of `renewed`, if it stays in the subset, is replaced by its new settings.
fn apply<R>(
    set: &Set,
    subset: &Subset,
    edit: impl FnOnce(&mut Vec<Target>) -> R,
    mut connected: HashMap<Key, tonic::transport::Channel>,
    renewed: Option<&Key>,
    reuse: Reuse,
) -> R {
    let mut all = crate::sync::lock(&subset.all);
    let result = edit(&mut all);
    let chosen = subset.settings.choose(&all);
    let keep: HashSet<&Key> = chosen.iter().map(|t| &t.key).collect();
    let add = chosen
        .iter()
        .map(|t| Joining {
            target: (*t).clone(),
            connected: connected.remove(&t.key),
        })
        .collect();
    let renewed = renewed.filter(|k| keep.contains(k));
    let (added, removed) = set.change(
        add,
        |i| !keep.contains(&i.target.key) || Some(&i.target.key) == renewed,
        reuse,
    );
    if added + removed > 0 {
        tracing::debug!(
            instances = all.len(),
            subset = chosen.len(),
            added,
            removed,
            "subset changed"
        );
    }
    result
}

/// [`Set::insert_in_place_of`] with subsetting: the endpoint joins the full list (replacing
/// the one of its URI, and `old`'s, in the same change); true if its URI was not in the list.
pub(crate) fn insert(
    set: &Set,
    subset: &Subset,
    target: Target,
    connected: Option<tonic::transport::Channel>,
    old: Option<&Key>,
) -> bool {
    let key = target.key.clone();
    let connected = connected
        .map(|c| HashMap::from([(key.clone(), c)]))
        .unwrap_or_default();
    apply(
        set,
        subset,
        |all| {
            if let Some(old) = old {
                all.retain(|t| t.key != *old);
            }
            match all.iter_mut().find(|t| t.key == target.key) {
                Some(old) => {
                    *old = target;
                    false
                }
                None => {
                    all.push(target);
                    true
                }
            }
        },
        connected,
        Some(&key),
        Reuse::No,
    )
}

/// Whether the full list has an instance of this URI.
pub(crate) fn has(subset: &Subset, key: &Key) -> bool {
    crate::sync::lock(&subset.all).iter().any(|t| t.key == *key)
}

/// Adds the builder's instances to the full list at once (one subset, rather than one per
/// instance), with the connections opened already.
pub(crate) fn extend(
    set: &Set,
    subset: &Subset,
    targets: Vec<Target>,
    connected: HashMap<Key, tonic::transport::Channel>,
) {
    apply(
        set,
        subset,
        |all| {
            for t in targets {
                match all.iter_mut().find(|o| o.key == t.key) {
                    Some(old) => *old = t,
                    None => all.push(t),
                }
            }
        },
        connected,
        None,
        Reuse::No,
    )
}

/// [`Set::remove`] with subsetting: true if the key was in the full list.
pub(crate) fn remove(set: &Set, subset: &Subset, key: &Key) -> bool {
    apply(
        set,
        subset,
        |all| {
            let before = all.len();
            all.retain(|t| t.key != *key);
            all.len() < before
        },
        HashMap::new(),
        None,
        Reuse::No,
    )
}

/// [`Set::sync`] with subsetting: the full list becomes `want`; returns how many of the full
/// list were added and removed.
pub(crate) fn sync(set: &Set, subset: &Subset, want: Vec<Target>) -> (usize, usize) {
    apply(
        set,
        subset,
        |all| {
            let keep: HashSet<&Key> = want.iter().map(|t| &t.key).collect();
            let removed = all.iter().filter(|t| !keep.contains(&t.key)).count();
            let had: HashMap<&Key, &Target> = all.iter().map(|t| (&t.key, t)).collect();
            let added = keep.iter().filter(|k| !had.contains_key(*k)).count();
            // The entries of the URIs it had keep their settings, as without subsetting.
            let mut seen = HashSet::with_capacity(want.len());
            let next: Vec<Target> = want
                .iter()
                .filter(|w| seen.insert(&w.key))
                .map(|w| (*had.get(&w.key).unwrap_or(&w)).clone())
                .collect();
            *all = next;
            (added, removed)
        },
        HashMap::new(),
        None,
        Reuse::Draining,
    )
}

/// An instance's place on the ring: a stable hash of its address (FNV-1a over the canonical
/// form, then a 64-bit finaliser so that addresses that differ in one digit land far apart).
/// The same on every client and in every release: clients of different versions must agree.
pub fn id_of(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finaliser.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The ring id of an instance's key: its URI as scheme, lower-cased authority and path (so
/// that `http://A:1` and `http://a:1/` are the same instance on every client), or its name.
fn id(key: &Key) -> u64 {
    match key {
        Key::Uri(uri) => {
            let authority = uri
                .authority()
                .map(|a| a.as_str().to_ascii_lowercase())
                .unwrap_or_default();
            let path = match uri.path() {
                "/" => "",
                p => p,
            };
            id_of(&format!(
                "{}://{authority}{path}",
                uri.scheme_str().unwrap_or("")
            ))
        }
        Key::Name(name) => id_of(name),
    }
}

/// The subset of client `index` of `count`: the positions in `ids` of the `size` instances
/// that follow slot `⌊index × n / count⌋` on the ring ordered by id (ties by the name). All of
/// them when `size >= ids.len()`.
pub fn choose_by(ids: &[(u64, &str)], size: usize, index: usize, count: usize) -> Vec<usize> {
    let n = ids.len();
    if size >= n {
        return (0..n).collect();
    }
    let mut ring: Vec<usize> = (0..n).collect();
    ring.sort_unstable_by(|&a, &b| ids[a].cmp(&ids[b]));
    let start = (index as u128 * n as u128 / count.max(1) as u128) as usize;
    (0..size).map(|j| ring[(start + j) % n]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("http://10.{}.{}.{}:50051", i >> 16, (i >> 8) & 255, i & 255))
            .collect()
    }

    /// Each client's subset, as positions in `names`.
    fn subsets(names: &[String], size: usize, count: usize) -> Vec<Vec<String>> {
        let ids: Vec<(u64, &str)> = names.iter().map(|n| (id_of(n), n.as_str())).collect();
        (0..count)
            .map(|c| {
                choose_by(&ids, size, c, count)
                    .into_iter()
                    .map(|i| names[i].clone())
                    .collect()
            })
            .collect()
    }

    /// Per client, how many members of `before` are not in `after`.
    fn moved(before: &[Vec<String>], after: &[Vec<String>]) -> Vec<usize> {
        before
            .iter()
            .zip(after)
            .map(|(b, a)| b.iter().filter(|m| !a.contains(m)).count())
            .collect()
    }

    proptest! {
        /// Balance: with a subset smaller than the set, every instance has ⌊count × size / n⌋
        /// clients or one more, and each client has exactly `size` distinct instances.
        #[test]
        fn every_instance_gets_about_the_same_number_of_clients(
            n in 2usize..400,
            count in 1usize..300,
            size_frac in 0.0f64..1.0,
        ) {
            let size = 1 + ((n - 1) as f64 * size_frac) as usize;
            let names = names(n);
            let subs = subsets(&names, size, count);
            let mut clients = std::collections::HashMap::<&str, usize>::new();
            for s in &subs {
                prop_assert_eq!(s.len(), size.min(n));
                let distinct: std::collections::HashSet<_> = s.iter().collect();
                prop_assert_eq!(distinct.len(), s.len());
                for m in s {
                    *clients.entry(m.as_str()).or_default() += 1;
                }
            }
            let low = count * size / n;
            let high = (count * size).div_ceil(n);
            for name in &names {
                let c = clients.get(name.as_str()).copied().unwrap_or(0);
                prop_assert!(c >= low && c <= high, "{name}: {c} clients, not in {low}..={high}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Stability: removing one instance, or adding one, changes at most two members of any
        /// client's subset (and the size stays), and, with a subset of at most half the set,
        /// on average (over the clients and over which instance leaves or joins) at most 1.1.
        #[test]
        fn one_membership_change_moves_about_one_member(
            n in 4usize..100,
            count in 1usize..50,
            size_frac in 0.0f64..1.0,
        ) {
            let size = 1 + ((n / 2 - 1) as f64 * size_frac) as usize;
            let all = names(n + 1);
            let (before_names, joined) = (all[..n].to_vec(), all[n].clone());
            let before = subsets(&before_names, size, count);
            let (mut removal, mut addition) = (0usize, 0usize);
            for gone in 0..n {
                let mut fewer = before_names.clone();
                fewer.remove(gone);
                let after = subsets(&fewer, size, count);
                prop_assert!(after.iter().all(|s| s.len() == size));
                let m = moved(&before, &after);
                prop_assert!(m.iter().all(|&x| x <= 2), "removal moved {m:?}");
                removal += m.iter().sum::<usize>();

                // An instance that joins lands anywhere on the ring: a different name each time.
                let mut more = before_names.clone();
                more.push(format!("{joined}/{gone}"));
                let after = subsets(&more, size, count);
                let m = moved(&before, &after);
                prop_assert!(m.iter().all(|&x| x <= 2), "addition moved {m:?}");
                addition += m.iter().sum::<usize>();
            }
            let per = (n * count) as f64;
            prop_assert!(removal as f64 / per <= 1.1, "removal: {} on average", removal as f64 / per);
            prop_assert!(addition as f64 / per <= 1.1, "addition: {} on average", addition as f64 / per);
        }
    }

    /// Bad settings are refused, naming the setting; good ones pass.
    #[test]
    fn settings_are_checked() {
        let name = |r: Result<Option<Aperture>, Error>| match r {
            Err(Error::InvalidSetting { name, .. }) => name,
            other => panic!("expected an invalid setting, got {other:?}"),
        };
        assert_eq!(name(Aperture::new(Some(0), Some((0, 1)))), "subset");
        assert_eq!(name(Aperture::new(Some(5), None)), "subset_client");
        assert_eq!(name(Aperture::new(Some(5), Some((3, 3)))), "subset_client");
        assert_eq!(name(Aperture::new(Some(5), Some((0, 0)))), "subset_client");
        assert_eq!(name(Aperture::new(None, Some((0, 2)))), "subset");
        assert_eq!(Aperture::new(None, None).unwrap(), None);
        assert_eq!(
            Aperture::new(Some(5), Some((1, 2))).unwrap(),
            Some(Aperture {
                size: 5,
                index: 1,
                count: 2
            })
        );
    }

    /// The ring id ignores what does not make a URI another instance (case of the host, a
    /// trailing slash) and is the same on every client (a fixed function of the address).
    #[test]
    fn ids_are_canonical_and_fixed() {
        let key = |s: &str| Key::Uri(s.parse().unwrap());
        assert_eq!(id(&key("http://Host:1")), id(&key("http://host:1/")));
        assert_ne!(id(&key("http://host:1")), id(&key("http://host:2")));
        assert_eq!(id(&key("http://host:1")), id_of("http://host:1"));
        // Pinned: a change of the hash would move every client's subset on upgrade.
        assert_eq!(id_of(""), 0xf52a_15e9_a9b5_e89b);
        assert_eq!(id_of("http://10.0.0.7:50051"), 0xb00e_f4eb_3099_fb35);
    }
}
