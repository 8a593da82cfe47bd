//! The resource kinds the stand-in serves and their API names.

/// The resources the stand-in serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Lease,
    Pod,
}

impl Kind {
    /// The plural resource name, as in URLs and RBAC rules.
    pub fn resource(self) -> &'static str {
        match self {
            Kind::Lease => "leases",
            Kind::Pod => "pods",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            Kind::Lease => "coordination.k8s.io",
            Kind::Pod => "",
        }
    }

    /// `resource.group`, as error messages name it.
    pub fn qualified(self) -> String {
        match self.group() {
            "" => self.resource().to_string(),
            g => format!("{}.{g}", self.resource()),
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Lease => "coordination.k8s.io/v1",
            Kind::Pod => "v1",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Kind::Lease => "Lease",
            Kind::Pod => "Pod",
        }
    }

    /// Whether a PUT to a missing object creates it (true for Leases).
    pub(crate) fn create_on_update(self) -> bool {
        self == Kind::Lease
    }
}
