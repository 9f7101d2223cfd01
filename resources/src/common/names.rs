//! DNS-1123 names, as Kubernetes checks them (`k8s.io/apimachinery/pkg/util/validation`): the checks are in
//! [`nodelet_shared::names`], which the client uses too.

pub use nodelet_shared::names::{
    MAX_LABEL_LEN, MAX_SUBDOMAIN_LEN, has_label_shape, is_dns_label, is_dns_subdomain,
};
