//! IPv4 networks in CIDR notation, as the pod network of the embedded containerd's CNI bridge is given.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// An IPv4 network in CIDR notation, aligned (`198.18.0.0/16`), with a prefix length between /8 and /28.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    prefix: u8,
}

/// Why a string is not an [`Ipv4Cidr`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// No `/`.
    #[error("{0:?} is not a CIDR like 198.18.0.0/16")]
    NotCidr(String),
    /// The address part is not an IPv4 address.
    #[error("{0:?} is not an IPv4 address")]
    Address(String),
    /// The prefix length is not a number.
    #[error("{0:?} is not a prefix length")]
    Prefix(String),
    /// The prefix length is outside /8../28.
    #[error("prefix length /{0} must be between /8 and /28")]
    PrefixRange(u8),
    /// The address has bits set beyond the prefix.
    #[error("{0:?} has host bits set (not a network address)")]
    HostBits(String),
}

/// The default pod network, 198.18.0.0/16, as a value.
pub fn default_pod_cidr() -> Ipv4Cidr {
    Ipv4Cidr { network: Ipv4Addr::new(198, 18, 0, 0), prefix: 16 }
}

impl Ipv4Cidr {
    /// The first host address (the bridge's gateway address in the generated CNI network).
    pub fn first_host(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }

    /// Whether `ip` lies in this network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix)) };
        u32::from(ip) & mask == u32::from(self.network)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (ip, prefix) = s.trim().split_once('/').ok_or_else(|| CidrError::NotCidr(s.to_owned()))?;
        let network: Ipv4Addr = ip.parse().map_err(|_| CidrError::Address(ip.to_owned()))?;
        let prefix: u8 = prefix.parse().map_err(|_| CidrError::Prefix(prefix.to_owned()))?;
        if !(8..=28).contains(&prefix) {
            return Err(CidrError::PrefixRange(prefix));
        }
        let host_bits = u32::from(network) & (u32::MAX >> u32::from(prefix));
        if host_bits != 0 {
            return Err(CidrError::HostBits(s.to_owned()));
        }
        Ok(Ipv4Cidr { network, prefix })
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}
